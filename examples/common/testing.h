#pragma once
// Test support for the trainers' command lines: runs a trainer binary as a user would and
// returns its exit status and what it printed. Header-only, for the test executables.

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fogo::trainer::testing {

/// The contents of the file at `path` ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A fresh directory under the system's temporary directory, named <prefix>_XXXXXX.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

struct CommandResult {
  int status = -1;  ///< the exit status; -1 when the process did not exit normally
  std::string out, err;
};

/// Runs `binary args` through the shell (args as typed), stdout and stderr captured apart.
inline CommandResult run_command(const std::string& binary, const std::string& args) {
  const std::string dir = make_temp_dir("fogo_cli");
  const std::string out = dir + "/out", err = dir + "/err";
  const int raw = std::system((binary + " " + args + " >" + out + " 2>" + err).c_str());
  CommandResult r;
  r.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  // Not remove_all: see the note on the torch wheel's std::filesystem in docs/trainers.md.
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  std::filesystem::remove(dir);
  return r;
}

/// The directory of the running test executable (/proc/self/exe).
inline std::filesystem::path executable_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

/// A program the tests run, found where it was installed with the tests rather than where it
/// was built (a copied or installed tree, the GPU machine's .device/bin): the path in the
/// environment variable `env` when it is set, else `name` beside the test executable. Throws
/// naming both when neither exists, so that a test fails saying where it looked.
inline std::string find_program(const char* env, const char* name) {
  if (const char* v = std::getenv(env); v && *v) {
    if (!std::filesystem::exists(v)) {
      throw std::runtime_error(std::string(env) + "=" + v + ": no such file");
    }
    return v;
  }
  const auto beside = executable_dir() / name;
  if (!std::filesystem::exists(beside)) {
    throw std::runtime_error(std::string(name) + " not found beside the test executable (" +
                             beside.string() + "); set " + env + " to its path");
  }
  return beside.string();
}

/// torchrun: the environment variable FOGO_TORCHRUN, else `built` (the one the build found,
/// beside its Python) when it exists, else the first `torchrun` on PATH; "" when none is found
/// (the tests that need it skip, saying so).
inline std::string find_torchrun(const std::string& built) {
  if (const char* v = std::getenv("FOGO_TORCHRUN"); v && *v) return v;
  if (!built.empty() && std::filesystem::exists(built)) return built;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const auto candidate = std::filesystem::path(dir) / "torchrun";
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return "";
}

/// The trainers the command-line tests run (FOGO_GPT2_BINARY / FOGO_RESNET_TRAIN_BINARY, else
/// beside the test executable).
inline std::string gpt2_binary() { return find_program("FOGO_GPT2_BINARY", "gpt2"); }
inline std::string resnet_train_binary() {
  return find_program("FOGO_RESNET_TRAIN_BINARY", "resnet_train");
}

/// Fashion-MNIST for the tests that train on it: FOGO_FASHION_MNIST_DIR (a folder of the same IDX
/// files, e.g. the subset `scripts/gpu_check.sh pack` ships), else Debian's
/// dataset-fashion-mnist.
inline std::string fashion_mnist_dir() {
  const char* v = std::getenv("FOGO_FASHION_MNIST_DIR");
  return v && *v ? v : "/usr/share/datasets/fashion-mnist";
}

/// The flags both trainers share, under the same names (each trainer's --help must list them).
inline constexpr const char* kSharedFlags[] = {
    "--out",    "--grad-clip",  "--stop-at-step", "--ns-dtype",    "--ckpt-every",
    "--resume", "--eval-every", "--log-every",    "--device",      "--threads",
    "--fogo",   "--ablation",   "--shard-step",   "--dist-timeout"};

}  // namespace fogo::trainer::testing

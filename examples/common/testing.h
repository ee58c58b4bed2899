#pragma once
// Test support for the trainers' command lines: runs a trainer binary as a user would and
// returns its exit status and what it printed. Header-only, for the test executables.

#include <stdlib.h>
#include <sys/wait.h>

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

/// The flags both trainers share, under the same names (each trainer's --help must list them).
inline constexpr const char* kSharedFlags[] = {
    "--out",    "--grad-clip",  "--stop-at-step", "--ns-dtype",    "--ckpt-every",
    "--resume", "--eval-every", "--log-every",    "--device",      "--threads",
    "--fogo",   "--ablation",   "--shard-step",   "--dist-timeout"};

}  // namespace fogo::trainer::testing

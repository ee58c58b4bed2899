#include "common/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/cli.h"

namespace fogo::trainer {

RunDirectory::RunDirectory(const std::string& dir, const std::vector<std::string>& files,
                           bool resume, bool overwrite)
    : dir_(dir) {
  Cli::require(!(resume && overwrite), "overwrite",
               "contradicts --resume (continue the run in --out, or replace it: not both)");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Cli::error("out", "cannot create " + dir + ": " + ec.message());
  const std::string lock = (fs::path(dir) / kLockFile).string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Cli::error("out", "cannot create " + lock + ": " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(lock) >> holder;
    ::close(fd_);
    fd_ = -1;
    throw Cli::error("out", dir + " is in use by another run (process " +
                                (holder.empty() ? std::string("?") : holder) + " holds " + lock +
                                "); give each run its own --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd_, pid.data(), pid.size(), 0);
  }
  if (resume) return;
  std::vector<std::string> found;
  for (const auto& name : files) {
    if (fs::exists(fs::path(dir) / name)) found.push_back(name);
  }
  if (found.empty()) return;
  std::string list;
  for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
  if (!overwrite) {
    ::close(fd_);
    fd_ = -1;
    throw Cli::error("out", dir + " holds a previous run (" + list +
                                "); add --resume to continue it, --overwrite to replace it, or "
                                "choose another --out");
  }
  for (const auto& name : found) fs::remove(fs::path(dir) / name);
}

RunDirectory::RunDirectory(RunDirectory&& other) noexcept
    : dir_(std::move(other.dir_)), fd_(other.fd_) {
  other.fd_ = -1;
}

RunDirectory::~RunDirectory() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace fogo::trainer

#pragma once
// A run's output folder (--out), claimed for the run's lifetime so that two runs never mix their
// files in one folder:
//
//   RunDirectory claim("runs/x", {"checkpoint.pt", "metrics.jsonl"}, cfg.resume, cfg.overwrite);
//
// - Another process writing there: refused. The claim is an exclusive flock on <dir>/.lock, which
//   the kernel releases when the process ends however it ends (crash, SIGKILL): a stale lock
//   file never blocks a later run.
// - A previous run's files there (any of `files`): refused unless the run continues it (resume)
//   or replaces it (overwrite, which removes them first, so no file of the old run, a best.pt
//   say, is left beside the new run's).
// Errors are CliErrors naming --out (exit status 2).

#include <string>
#include <vector>

namespace fogo::trainer {

class RunDirectory {
 public:
  /// Creates `dir` if needed and claims it; see above. `resume` and `overwrite` together are
  /// refused.
  RunDirectory(const std::string& dir, const std::vector<std::string>& files, bool resume,
               bool overwrite);
  ~RunDirectory();
  RunDirectory(RunDirectory&& other) noexcept;
  RunDirectory& operator=(RunDirectory&&) = delete;
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;  ///< the open, locked .lock file
};

/// The name of the lock file in a claimed folder.
inline constexpr const char* kLockFile = ".lock";

}  // namespace fogo::trainer

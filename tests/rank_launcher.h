#pragma once
// Test support for data-parallel code: starts the ranks of a job as processes on this machine,
// each with the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1,
// MASTER_PORT on a free loopback port), and collects their exit statuses and output.
// Header-only; used by tests/test_distributed.cpp and the trainers' tests.
//
//   auto run = fogo::testing::launch_ranks({.exe = binary, .args = {"train", "--steps", "4"},
//                                           .nprocs = 2, .log_dir = dir});
//   for (auto& r : run.ranks) EXPECT_EQ(r.code, 0) << run.logs();

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fogo::testing {

/// A loopback TCP port nobody listens on (now).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("free_port: no loopback port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

using Env = std::map<std::string, std::string>;

struct RankResult {
  bool exited = false;
  int code = -1;    ///< exit status; -1 when killed by a signal
  int signal = 0;   ///< the signal that ended it, or 0
  std::string log;  ///< stdout and stderr together
};

struct RankLaunch {
  std::string exe;                ///< the program every rank runs
  std::vector<std::string> args;  ///< its arguments (argv[1...]), the same on every rank
  /// Arguments appended on rank r after `args` (flags one rank was launched with differently).
  std::function<std::vector<std::string>(int)> rank_args;
  int nprocs = 2;  ///< ranks to start; WORLD_SIZE = nprocs unless `extra` says
  /// Variables set on rank r on top of the inherited environment and the torchrun ones.
  std::function<Env(int)> extra;
  std::filesystem::path log_dir;  ///< rank<r>.log go there (it must exist)
  double deadline_s = 120;        ///< ranks still running after this are SIGKILLed
};

struct RankRun {
  std::vector<RankResult> ranks;
  double seconds = 0;
  bool killed = false;  ///< the deadline ran out

  std::string logs() const {
    std::ostringstream out;
    for (size_t r = 0; r < ranks.size(); ++r) {
      out << "---- rank " << r << " (exit " << ranks[r].code << ", signal " << ranks[r].signal
          << ")\n"
          << ranks[r].log;
    }
    return out.str();
  }
  bool all_succeeded() const {
    for (const auto& r : ranks) {
      if (r.code != 0) {
        return false;
      }
    }
    return !killed;
  }
};

/// Starts the ranks (fork/exec), waits for all of them (at most `deadline_s`), reads their logs.
/// Every rank gets OMP_NUM_THREADS=1 unless `extra` sets it.
inline RankRun launch_ranks(const RankLaunch& spec) {
  using Clock = std::chrono::steady_clock;
  RankRun run;
  const auto port = free_port();
  std::vector<pid_t> pids;
  const auto start = Clock::now();
  const auto log_path = [&](int r) { return spec.log_dir / ("rank" + std::to_string(r) + ".log"); };
  for (int r = 0; r < spec.nprocs; ++r) {
    Env env;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      const auto eq = kv.find('=');
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env.erase("TORCHELASTIC_USE_AGENT_STORE");
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(spec.nprocs);
    env["LOCAL_WORLD_SIZE"] = std::to_string(spec.nprocs);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    env["OMP_NUM_THREADS"] = "1";
    if (spec.extra) {
      for (const auto& [k, v] : spec.extra(r)) {
        env[k] = v;
      }
    }
    std::vector<std::string> kvs;
    for (const auto& [k, v] : env) {
      kvs.push_back(k + "=" + v);
    }
    std::vector<char*> envp;
    for (auto& kv : kvs) {
      envp.push_back(kv.data());
    }
    envp.push_back(nullptr);
    std::vector<std::string> args{spec.exe};
    args.insert(args.end(), spec.args.begin(), spec.args.end());
    if (spec.rank_args) {
      for (const auto& a : spec.rank_args(r)) {
        args.push_back(a);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    const auto log = log_path(r).string();
    const pid_t pid = fork();
    if (pid == 0) {
      FILE* f = std::fopen(log.c_str(), "w");
      if (f) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
      execve(spec.exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  run.ranks.resize(spec.nprocs);
  std::vector<bool> done(spec.nprocs, false);
  for (int left = spec.nprocs; left > 0;) {
    for (int r = 0; r < spec.nprocs; ++r) {
      int status = 0;
      if (!done[r] && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        run.ranks[r].exited = WIFEXITED(status);
        run.ranks[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        run.ranks[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
    }
    if (left > 0 && std::chrono::duration<double>(Clock::now() - start).count() > spec.deadline_s) {
      run.killed = true;
      for (int r = 0; r < spec.nprocs; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < spec.nprocs; ++r) {
    std::ifstream in(log_path(r));
    run.ranks[r].log.assign(std::istreambuf_iterator<char>(in), {});
  }
  return run;
}

}  // namespace fogo::testing

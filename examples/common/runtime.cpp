#include "common/runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "common/cli.h"

namespace fogo::trainer {

torch::Device parse_device(const std::string& text, const std::string& flag) {
  if (text == "auto") return torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  c10::optional<torch::Device> device;
  try {
    device = torch::Device(text);
  } catch (const std::exception&) {
    throw std::invalid_argument("--" + flag + ": '" + text +
                                "' is not a device (cpu, cuda, cuda:N or auto)");
  }
  if (device->is_cuda()) {
    if (!torch::cuda::is_available()) {
      throw std::invalid_argument("--" + flag + ": " + text +
                                  " asked for, but this machine has no usable CUDA device");
    }
    if (device->has_index() &&
        device->index() >= static_cast<int64_t>(torch::cuda::device_count())) {
      throw std::invalid_argument("--" + flag + ": " + text + " does not exist (" +
                                  std::to_string(torch::cuda::device_count()) + " CUDA devices)");
    }
  } else if (!device->is_cpu()) {
    throw std::invalid_argument("--" + flag + ": only cpu and cuda devices are supported, got '" +
                                text + "'");
  }
  return *device;
}

void make_deterministic(int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  auto& ctx = at::globalContext();
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
}

void set_threads(int64_t threads) {
  // Far more threads than cores only slows the run (a million of them looks like a hang).
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  Cli::require(threads >= 0 && threads <= 4 * cores, "threads",
               "must be in [0, " + std::to_string(4 * cores) + "] (4 x the " +
                   std::to_string(cores) + " CPUs of this machine; 0: torch's default), got " +
                   std::to_string(threads));
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
}

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
}

void stop_when_orphaned(std::chrono::milliseconds interval) {
  static std::atomic<bool> started{false};
  if (started.exchange(true)) return;
  const pid_t parent = ::getppid();
  // Made now: once the parent is gone only async-signal-safe calls are made (the other threads
  // may hold any lock, the allocator's included).
  const std::string line = "error: the parent process (pid " + std::to_string(parent) +
                           ") ended; this orphaned worker stops (exit status 1)\n";
  std::thread([parent, interval, line] {
    while (::getppid() == parent) std::this_thread::sleep_for(interval);
    [[maybe_unused]] const ssize_t w = ::write(2, line.data(), line.size());
    ::_exit(1);
  }).detach();
}

void exit_with_torchrun_agent() {
  if (std::getenv("TORCHELASTIC_RUN_ID")) stop_when_orphaned();
}

std::string describe_runtime(const torch::Device& device) {
  std::string out = "torch " TORCH_VERSION ", device " + device.str();
  out += ", " + std::to_string(at::get_num_threads()) + " CPU threads";
  return out;
}

}  // namespace fogo::trainer

#pragma once
// Run-time set-up shared by the trainers: device choice, determinism, CPU threads.

#include <ATen/autocast_mode.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace fogo::trainer {

/// "cpu", "cuda", "cuda:N" or "auto" (CUDA when available). Throws std::invalid_argument naming
/// `flag` when the text is not a device or CUDA was asked for but is not available.
torch::Device parse_device(const std::string& text, const std::string& flag = "device");

/// Seeds torch's global generators and asks for deterministic kernels (cuDNN deterministic, no
/// benchmark autotuning, deterministic algorithms where PyTorch has them, warning otherwise), so
/// two runs with one seed on one machine agree.
void make_deterministic(int64_t seed);

/// Sets torch's intra-op threads (0 leaves torch's default); a CliError naming --threads beyond
/// 4 x the machine's CPUs.
void set_threads(int64_t threads);

/// bf16 autocast for the forward pass, as torch.autocast(device_type, dtype=torch.bfloat16).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType type, bool enabled) : type_(type), enabled_(enabled) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    // The cast-weight cache lives for the outermost autocast region, as in Python.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, previous_);
    at::autocast::set_autocast_dtype(type_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_, previous_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

/// Under torchrun (TORCHELASTIC_RUN_ID set), stop_when_orphaned(): a worker whose agent was
/// killed (the OOM killer, SIGKILL) would otherwise train on, and write into --out, unseen. A
/// process started otherwise (a shell, nohup, a launch script) is left alone. Idempotent.
void exit_with_torchrun_agent();

/// Starts a thread that ends this process (exit status 1, one line on stderr naming the parent)
/// within `interval` of its parent process ending. Idempotent (one watchdog per process).
void stop_when_orphaned(std::chrono::milliseconds interval = std::chrono::milliseconds(500));

/// This machine's physical memory in bytes (0 when unknown): the bound of the flags whose size
/// only the machine limits, checked before an allocator's message would say it less clearly.
double physical_memory_bytes();

/// The torch build, device and thread count in one line, for logs and result files.
std::string describe_runtime(const torch::Device& device);

}  // namespace fogo::trainer

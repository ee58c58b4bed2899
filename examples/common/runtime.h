#pragma once
// Run-time set-up shared by the trainers: device choice, determinism, CPU threads.

#include <torch/types.h>

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

/// Sets torch's intra-op threads (0 leaves torch's default).
void set_threads(int64_t threads);

/// The torch build, device and thread count in one line, for logs and result files.
std::string describe_runtime(const torch::Device& device);

}  // namespace fogo::trainer

#include "common/runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <stdexcept>

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
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
}

std::string describe_runtime(const torch::Device& device) {
  std::string out = "torch " TORCH_VERSION ", device " + device.str();
  out += ", " + std::to_string(at::get_num_threads()) + " CPU threads";
  return out;
}

}  // namespace fogo::trainer

#pragma once
// What fogo_bench's step benchmarks share (bench_step.cpp, bench_paths.cpp): the arguments'
// device and NS dtype, the parameters of a model set with gradients, and the timing loop.
#include <benchmark/benchmark.h>
#include <fogo/ns_dtype.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "model_sets.h"

namespace fogo::bench {

struct Setup {
  torch::Device device{torch::kCPU};
  torch::ScalarType ns_dtype = torch::kBFloat16;
  bool ok = true;
};

/// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32, 2 auto);
/// labels the row (then `extra`); not ok (the row skipped) where CUDA is asked for and absent.
inline Setup setup(benchmark::State& state, const std::string& extra = "") {
  Setup s;
  s.device = state.range(1) == 0 ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA);
  s.ns_dtype = state.range(2) == 0   ? torch::kBFloat16
               : state.range(2) == 1 ? torch::kFloat
                                     : fogo::kNSDtypeAuto;
  if (s.device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    s.ok = false;
  }
  state.SetLabel(std::string(set_name(state.range(0))) + (s.device.is_cuda() ? " cuda" : " cpu") +
                 " ns-" + fogo::ns_dtype_name(s.ns_dtype) + extra);
  return s;
}

inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

/// The set's matrices, N(0, 0.02^2), each with an N(0, 1) gradient (seed 0).
inline std::vector<torch::Tensor> make_params(int64_t set, const torch::Device& device) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (const Shape& shape : model_shapes(set)) {
    auto p = (0.02 * torch::randn(shape)).to(device).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape).to(device);
    params.push_back(p);
  }
  return params;
}

/// Times `step` after `warmup` untimed calls (FOGO's first step initialises its codebook and does
/// not filter; the second is the first steady-state one).
inline void time_steps(benchmark::State& state, const torch::Device& device, int warmup,
                       const std::function<void()>& step) {
  for (int k = 0; k < warmup; ++k) step();
  synchronize(device);
  for (auto _ : state) {
    step();
    synchronize(device);
  }
}

}  // namespace fogo::bench

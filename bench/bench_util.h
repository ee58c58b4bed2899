#pragma once
// What fogo_bench's step and stage rows share (bench_step.cpp, bench_stages.cpp, bench_paths.cpp):
// the arguments every row takes (set, device, NS dtype), the parameters of a set with their
// gradients, the timed loop, and the traffic counters.
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "model_sets.h"

namespace fogo::bench {

struct Setup {
  torch::Device device{torch::kCPU};
  torch::ScalarType ns_dtype = torch::kBFloat16;
  bool ok = true;  ///< false: the row was skipped (no CUDA device)
};

/// The row's device (range 1: 0 CPU, 1 CUDA) and NS dtype (range 2: 0 bf16, 1 fp32, 2 auto), and
/// its label (then `extra`); a CUDA row without a device is skipped with an error (ok false).
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

/// The set's matrices on `device` (seed 0), each with a gradient.
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

/// Counters beside the time, so that a run shows each stage's distance from its roof without
/// arithmetic by hand: "bytes" (per call) is the traffic the stage cannot avoid, every input read
/// once and every output written once (its floor; a kernel that reads twice moves more), "GB/s"
/// that over the measured time; "flop" and "TFLOP/s" the arithmetic of the GEMMs (2 per
/// multiply-add; Newton–Schulz as newton_schulz_macs counts it). Compare GB/s with the device's
/// memory bandwidth (H100 SXM: 3.35 TB/s) and TFLOP/s with its peak (bf16 dense: 989).
inline void set_traffic(benchmark::State& state, double bytes, double flops) {
  using benchmark::Counter;
  if (bytes > 0) {
    state.counters["bytes"] = bytes;
    state.counters["GB/s"] = Counter(bytes * 1e-9, Counter::kIsIterationInvariantRate);
  }
  if (flops > 0) {
    state.counters["flop"] = flops;
    state.counters["TFLOP/s"] = Counter(flops * 1e-12, Counter::kIsIterationInvariantRate);
  }
}

}  // namespace fogo::bench

// Google Benchmark: one optimizer step per iteration on the GPT-2-small matrix shapes, and the
// Newton–Schulz kernel alone. Runs on CPU, and on CUDA when a GPU is present.
//   build/bench/fogo_bench --benchmark_filter=... [--benchmark_min_time=...]
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace {

// GPT-2 small: attention proj, MLP up, MLP down, fused QKV.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {768, 768}, {768, 3072}, {3072, 768}, {768, 2304}};

torch::Device device_of(int64_t code) { return code == 0 ? torch::kCPU : torch::kCUDA; }

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

bool skip_without_device(benchmark::State& state, const torch::Device& device) {
  if (device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::Tensor)>;

// Args: shape index, device (0 CPU, 1 CUDA).
void optimizer_step(benchmark::State& state, const Factory& make) {
  const auto [m, n] = kShapes[state.range(0)];
  const torch::Device device = device_of(state.range(1));
  if (skip_without_device(state, device)) return;
  torch::Tensor p = torch::randn({m, n}, device).requires_grad_(true);
  p.mutable_grad() = torch::randn({m, n}, device);
  auto opt = make(p);
  opt->step();  // state allocation outside the timed loop
  synchronize(device);
  for (auto _ : state) {
    opt->step();
    synchronize(device);
  }
  state.SetLabel(std::to_string(m) + "x" + std::to_string(n) +
                 (device.is_cuda() ? " cuda" : " cpu"));
}

void BM_MuonStep_bf16(benchmark::State& state) {
  optimizer_step(state, [](torch::Tensor p) {
    return std::make_unique<fogo::Muon>(std::vector<torch::Tensor>{p}, fogo::MuonOptions(0.02));
  });
}
void BM_MuonStep_fp32(benchmark::State& state) {
  optimizer_step(state, [](torch::Tensor p) {
    return std::make_unique<fogo::Muon>(std::vector<torch::Tensor>{p},
                                        fogo::MuonOptions(0.02).ns_dtype(torch::kFloat));
  });
}
// The paper's GPT-2 configuration (C = 256, d = 512), fp32 Newton–Schulz and bf16 (the default).
void BM_FOGOStep_fp32(benchmark::State& state) {
  optimizer_step(state, [](torch::Tensor p) {
    return std::make_unique<fogo::FOGO>(std::vector<torch::Tensor>{p},
                                        fogo::presets::gpt2().ns_dtype(torch::kFloat));
  });
}
void BM_FOGOStep_bf16(benchmark::State& state) {
  optimizer_step(state, [](torch::Tensor p) {
    return std::make_unique<fogo::FOGO>(std::vector<torch::Tensor>{p}, fogo::presets::gpt2());
  });
}
void BM_AdamWStep(benchmark::State& state) {
  optimizer_step(state, [](torch::Tensor p) {
    return std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{p},
                                                 torch::optim::AdamWOptions(1e-3));
  });
}

// Args: shape index, device, dtype (0 fp32, 1 bf16), batch.
void BM_NewtonSchulz(benchmark::State& state) {
  const auto [m, n] = kShapes[state.range(0)];
  const torch::Device device = device_of(state.range(1));
  if (skip_without_device(state, device)) return;
  fogo::NSConfig config;
  config.compute_dtype = state.range(2) == 0 ? torch::kFloat : torch::kBFloat16;
  const int64_t batch = state.range(3);
  const torch::Tensor B =
      batch == 1 ? torch::randn({m, n}, device) : torch::randn({batch, m, n}, device);
  for (auto _ : state) {
    benchmark::DoNotOptimize(fogo::newton_schulz(B, config));
    synchronize(device);
  }
  state.SetLabel(std::to_string(batch) + "x" + std::to_string(m) + "x" + std::to_string(n) +
                 (config.compute_dtype == torch::kFloat ? " fp32" : " bf16") +
                 (device.is_cuda() ? " cuda" : " cpu"));
}

void shapes_on(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t s = 0; s < static_cast<int64_t>(kShapes.size()); ++s) b->Args({s, device});
}
void ns_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t dtype : {0, 1})
      for (int64_t s = 0; s < static_cast<int64_t>(kShapes.size()); ++s)
        for (int64_t batch : {1, 2}) b->Args({s, device, dtype, batch});
}

BENCHMARK(BM_MuonStep_fp32)->Apply(shapes_on)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MuonStep_bf16)->Apply(shapes_on)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FOGOStep_fp32)->Apply(shapes_on)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FOGOStep_bf16)->Apply(shapes_on)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamWStep)->Apply(shapes_on)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_NewtonSchulz)->Apply(ns_args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

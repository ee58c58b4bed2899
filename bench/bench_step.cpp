// Google Benchmark (part of fogo_bench): one optimizer step over a whole model's matrix
// parameters, for FOGO, fogo::Muon and LibTorch's AdamW, on CPU and CUDA, and FOGO's step stage by
// stage on the same inputs (the profile breakdown of docs/benchmarks.md).
//
//   Model sets: GPT-2 small (124M): its 48 matrices, 12 x {768x2304 qkv, 768x768 attention proj,
//   3072x768 MLP fc, 768x3072 MLP proj}, 84.9M weights; ResNet-18 for CIFAR (11.17M): its 21
//   conv and fc weights, 11.16M (the rest is BatchNorm and the fc bias, AdamW's in a hybrid).
//   FOGO runs the paper's preset for the set (GPT-2: C 256, d 512; ResNet: the class-imbalanced
//   backbone, C 96, d 128) as one codebook group, in steady state (after its first two steps).
//
//   fogo_bench --benchmark_filter='Step|Stage'                            everything
//   fogo_bench --benchmark_filter='/1/' --benchmark_min_time=0.01          (CPU: one step each)
// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32)[, stage].
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <fogo/ops.h>
#include <fogo/projection.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "model_sets.h"

namespace {

using fogo::bench::fogo_preset;
using fogo::bench::model_shapes;
using fogo::bench::set_name;
using fogo::bench::Shape;

struct Setup {
  torch::Device device{torch::kCPU};
  torch::ScalarType ns_dtype = torch::kBFloat16;
  bool ok = true;
};

Setup setup(benchmark::State& state) {
  Setup s;
  s.device = state.range(1) == 0 ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA);
  s.ns_dtype = state.range(2) == 0 ? torch::kBFloat16 : torch::kFloat;
  if (s.device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    s.ok = false;
  }
  state.SetLabel(std::string(set_name(state.range(0))) + (s.device.is_cuda() ? " cuda" : " cpu") +
                 (s.ns_dtype == torch::kFloat ? " ns-fp32" : " ns-bf16"));
  return s;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

std::vector<torch::Tensor> make_params(int64_t set, const torch::Device& device) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (const Shape& shape : model_shapes(set)) {
    auto p = (0.02 * torch::randn(shape)).to(device).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape).to(device);
    params.push_back(p);
  }
  return params;
}

// Times `step` after `warmup` untimed calls (FOGO's first step initialises its codebook and does
// not filter; the second is the first steady-state one).
void time_steps(benchmark::State& state, const torch::Device& device, int warmup,
                const std::function<void()>& step) {
  for (int k = 0; k < warmup; ++k) step();
  synchronize(device);
  for (auto _ : state) {
    step();
    synchronize(device);
  }
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor>, int64_t set, torch::ScalarType)>;

void optimizer_step(benchmark::State& state, const Factory& make) {
  const Setup s = setup(state);
  if (!s.ok) return;
  auto params = make_params(state.range(0), s.device);
  auto opt = make(params, state.range(0), s.ns_dtype);
  time_steps(state, s.device, 2, [&] { opt->step(); });
}

void BM_Step_FOGO(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt));
  });
}
// The same step with NonFinitePolicy::Mask (no host read-back of the gradient check; every
// parameter copied before its update and the group's memory selected back on the device): the
// price of a sync-free step against the default Raise.
void BM_Step_FOGOMask(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(
        p, fogo_preset(set, dt).nonfinite(fogo::NonFinitePolicy::Mask));
  });
}
// Mask steps replayed from a CUDA graph (FOGOOptions::cuda_graph; CUDA only): one launch per
// group instead of a few hundred, no host synchronisation. The re-seeding steps in the timed
// ones run eagerly, as in training.
void BM_Step_FOGOGraph(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(
        p, fogo_preset(set, dt).nonfinite(fogo::NonFinitePolicy::Mask).cuda_graph(true));
  });
}
// Both streams through the Gram form with restarts where the cost model says it is cheaper
// (ns_form Auto; the fast stream as P_f = O_f Pi): the data for choosing the default form.
void BM_Step_FOGOAuto(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).ns_form(fogo::NSForm::Auto));
  });
}
// fusion_only (presets::fusion_only): both streams through Newton–Schulz and their slerp in
// parameter space, no projection, codebook or filter: the price of FOGO without its memory.
void BM_Step_FOGOFusionOnly(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo::presets::fusion_only(fogo_preset(set, dt)));
  });
}
void BM_Step_Muon(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt));
  });
}
// fogo::Muon sync-free (Mask) and replayed from a CUDA graph (CUDA only): the issue's "batched,
// sync-free, graph-captured" Muon.
void BM_Step_MuonGraph(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02)
                                               .ns_dtype(dt)
                                               .nonfinite(fogo::NonFinitePolicy::Mask)
                                               .cuda_graph(true));
  });
}
void BM_Step_MuonAuto(benchmark::State& state) {  // as BM_Step_FOGOAuto
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(
        p, fogo::MuonOptions(0.02).ns_dtype(dt).ns_form(fogo::NSForm::Auto));
  });
}
void BM_Step_AdamW(benchmark::State& state) {  // the NS dtype argument is ignored
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  });
}

// ---------------------------------------------------------------------------------------------
// FOGO's step by stage: each stage of ALGORITHM.md run alone on inputs of the real shapes, with
// the same batching and routes as the optimizer (orthogonalize() in fogo_optimizer.cpp).

enum Stage : int64_t {
  kMomenta,        // step 1: B = mu B + G, both streams
  kNs,             // step 2, both streams per shape: one batched chain of 2P matrices, or (fp32,
                   // wide shapes) the slow chain and the fast stream's Gram route incl. X0 Pi
  kProject,        // step 3: P_s, and P_f unless the Gram route gave it, one GEMM per shape
  kProjected,      // steps 4-7: ops::projected_step, no frozen centroids
  kProjectedLt48,  // steps 4-7 with 48 frozen candidates (class-IL's lt_candidates)
  kLift,           // step 8: proximal lift per parameter
  kUpdate,         // step 9: ops::apply_rms_update, the whole set in one call
  kFlush,          // codebook flush
  kNumStages
};
const char* kStageNames[] = {
    "momenta", "ns", "project", "projected_step", "projected_step_lt48", "lift", "update", "flush"};

struct Bucket {
  int64_t m, n;
  bool gram;                    // the fast stream takes the Gram route
  torch::Tensor Bs, Bf, Pi, O;  // momenta [P, m, n], Pi [n, d], what step 3 projects
};

fogo::NSConfig ns_config(const fogo::FOGOOptions& o, torch::ScalarType dtype) {
  fogo::NSConfig ns;
  ns.steps = o.ns_steps_slow();
  ns.eps = o.eps();
  ns.normalization = fogo::NSNormalization::AddEps;
  ns.compute_dtype = dtype;
  return ns;
}

void BM_Stage_FOGO(benchmark::State& state) {
  const Setup s = setup(state);
  if (!s.ok) return;
  const int64_t set = state.range(0), stage = state.range(3);
  state.SetLabel(std::string(kStageNames[stage]) + " " + set_name(set) +
                 (s.device.is_cuda() ? " cuda" : " cpu") +
                 (s.ns_dtype == torch::kFloat ? " ns-fp32" : " ns-bf16"));
  const auto o = fogo_preset(set, s.ns_dtype);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(s.device);
  const int64_t d = o.proj_dim(), C = o.codebook_size();
  torch::manual_seed(0);

  // Working orientation of every parameter, grouped by shape as the optimizer does.
  std::map<std::pair<int64_t, int64_t>, std::vector<Shape>> groups;
  std::vector<Shape> shapes = model_shapes(set);
  for (const Shape& shape : shapes) {
    const int64_t rows = shape[0], cols = c10::multiply_integers(shape) / rows;
    groups[{std::min(rows, cols), std::max(rows, cols)}].push_back(shape);
  }
  std::vector<Bucket> buckets;
  int64_t R = 0;
  const auto ns = ns_config(o, s.ns_dtype);
  for (const auto& [mn, members] : groups) {
    const auto [m, n] = mn;
    const int64_t P = static_cast<int64_t>(members.size());
    // As orthogonalize() decides (fogo_optimizer.cpp).
    const bool gram =
        (s.ns_dtype == torch::kFloat ||
         (o.ns_form() != fogo::NSForm::Plain && o.ns_gram_restart() > 0)) &&
        fogo::newton_schulz_projected_is_cheaper(m, n, d, o.ns_steps_fast(), o.ns_gram_restart());
    const auto Os = fogo::newton_schulz(torch::randn({P, m, n}, f32), ns);
    buckets.push_back({m, n, gram, torch::randn({P, m, n}, f32), torch::randn({P, m, n}, f32),
                       fogo::rademacher(o.seed(), n, d, o.projection_scale(), s.device),
                       gram ? Os : torch::cat({Os, Os})});
    R += P * m;
  }
  // As the optimizer: bf16 products with the exact +-1 of Pi when NS computes in bf16.
  const bool bf16 = s.ns_dtype == torch::kBFloat16;
  std::map<int64_t, torch::Tensor> Pi_bf16;
  for (const auto& b : buckets) Pi_bf16[b.n] = bf16 ? b.Pi.to(torch::kBFloat16) : torch::Tensor();
  const auto project = [&](const Bucket& b, const torch::Tensor& O) {
    const auto rows = O.reshape({-1, b.n});
    return bf16 ? fogo::mm_bf16_f32(rows, Pi_bf16.at(b.n)) : rows.to(torch::kFloat).mm(b.Pi);
  };

  std::function<void()> run;
  switch (stage) {
    case kMomenta: {  // both momenta and the NS inputs, as the step writes them
      std::vector<fogo::MomentaItem> items;
      for (const Shape& shape : shapes) {
        const int64_t rows = shape[0], cols = c10::multiply_integers(shape) / rows;
        const auto x_shape =
            rows > cols ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
        items.push_back({torch::zeros(shape, f32), torch::zeros(shape, f32),
                         torch::randn(shape, f32), torch::empty(x_shape, f32.dtype(s.ns_dtype)),
                         torch::empty(x_shape, f32.dtype(s.ns_dtype)), rows > cols});
      }
      run = [=] { fogo::ops::momenta_step(items, o.mu_s(), o.mu_f(), {}); };
      break;
    }
    case kNs:
      run = [&] {
        for (const auto& b : buckets) {
          if (b.gram) {
            benchmark::DoNotOptimize(fogo::newton_schulz(b.Bs, ns));
            benchmark::DoNotOptimize(fogo::newton_schulz_projected(b.Bf, b.Pi, ns));
          } else {
            benchmark::DoNotOptimize(fogo::newton_schulz(torch::cat({b.Bs, b.Bf}), ns));
          }
        }
      };
      break;
    case kProject:
      run = [&] {
        for (const auto& b : buckets) benchmark::DoNotOptimize(project(b, b.O));
      };
      break;
    case kProjected:
    case kProjectedLt48: {
      const auto Ps = torch::randn({R, d}, f32) * 4, Pf = Ps + torch::randn({R, d}, f32) * 4;
      const auto cbar = fogo::normalize_rows(torch::randn({C, d}, f32), 0.0);
      const int64_t K = stage == kProjectedLt48 ? 48 : 0;
      const auto frozen = fogo::normalize_rows(torch::randn({K, d}, f32), 0.0);
      const auto nu = torch::full({K}, 1.0 / 48, f32);
      const auto rbar = torch::zeros({}, f32);
      const auto p = fogo::projected_step_params(o, /*filter=*/true);
      run = [=] {
        benchmark::DoNotOptimize(fogo::ops::projected_step(Ps, Pf, cbar, frozen, nu, rbar, p).dz);
      };
      break;
    }
    case kLift: {  // one GEMM per shape run, its rows [P m, d], K in the step's precision
      std::vector<std::pair<torch::Tensor, torch::Tensor>> work;
      for (const auto& b : buckets) {
        const auto K = fogo::lift_operator(b.Pi, o.lambda_prox());
        work.push_back(
            {torch::randn({b.Bs.size(0) * b.m, d}, f32), bf16 ? K.to(torch::kBFloat16) : K});
      }
      run = [=] {
        for (const auto& [dz, K] : work) benchmark::DoNotOptimize(fogo::proximal_lift(dz, K));
      };
      break;
    }
    case kUpdate: {
      auto params = make_params(set, s.device);
      std::vector<std::pair<torch::Tensor, torch::Tensor>> inputs;
      for (const auto& p : params) {
        const int64_t rows = p.size(0), cols = p.numel() / rows;
        const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
        // O_s in the NS compute dtype, as the optimizer passes it.
        inputs.push_back(
            {torch::randn({m, n}, f32).to(s.ns_dtype), 0.1 * torch::randn({m, n}, f32)});
      }
      std::vector<fogo::RmsUpdateItem> items;
      for (size_t k = 0; k < params.size(); ++k) {
        const bool transposed = params[k].size(0) > params[k].numel() / params[k].size(0);
        items.push_back({params[k], inputs[k].first, inputs[k].second, transposed});
      }
      run = [=]() mutable {
        torch::NoGradGuard no_grad;
        benchmark::DoNotOptimize(
            fogo::ops::apply_rms_update(items, {o.lr(), o.weight_decay(), o.sigma(), o.eps()}));
      };
      break;
    }
    case kFlush: {
      fogo::Codebook book{fogo::normalize_rows(torch::randn({C, d}, f32), 0.0),
                          torch::rand({C, d}, f32), torch::rand({C}, f32)};
      const fogo::Assignments acc{torch::rand({C}, f32) * 100, torch::randn({C, d}, f32)};
      run = [=]() mutable {
        fogo::ops::codebook_flush(book, acc, {o.beta_cb(), o.lambda_c(), o.eps(), o.r_dec()});
      };
      break;
    }
  }
  time_steps(state, s.device, 1, run);
}

void step_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1}) b->Args({set, device, dtype});
}
void graph_args(benchmark::internal::Benchmark* b) {
  for (int64_t set : {0, 1})
    for (int64_t dtype : {0, 1}) b->Args({set, 1, dtype});
}
void adamw_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1}) b->Args({set, device, 0});
}
void stage_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1})
        for (int64_t stage = 0; stage < kNumStages; ++stage) b->Args({set, device, dtype, stage});
}

BENCHMARK(BM_Step_FOGO)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOMask)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOGraph)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOAuto)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOFusionOnly)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_Muon)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonAuto)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonGraph)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_AdamW)->Apply(adamw_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Stage_FOGO)->Apply(stage_args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// Google Benchmark (part of fogo_bench): one optimizer step over a whole model's matrix
// parameters, for FOGO, fogo::Muon and LibTorch's AdamW, on CPU and CUDA (bench_stages.cpp times
// FOGO's step stage by stage on the same inputs).
//
//   Model sets: GPT-2 small (124M): its 48 matrices, 12 x {768x2304 qkv, 768x768 attention proj,
//   3072x768 MLP fc, 768x3072 MLP proj}, 84.9M weights; ResNet-18 for CIFAR (11.17M): its 21
//   conv and fc weights, 11.16M (the rest is BatchNorm and the fc bias, AdamW's in a hybrid).
//   FOGO runs the paper's preset for the set (GPT-2: C 256, d 512; ResNet: the class-imbalanced
//   backbone, C 96, d 128) as one codebook group, in steady state (after its first two steps).
//
//   fogo_bench --benchmark_filter='Step|Stage'                            everything
//   fogo_bench --benchmark_filter='/1/' --benchmark_min_time=0.01          (CPU: one step each)
// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32, 2 auto:
// the optimizers' default).
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "model_sets.h"

namespace {

using fogo::bench::fogo_preset;
using fogo::bench::make_params;
using fogo::bench::model_shapes;
using fogo::bench::set_traffic;
using fogo::bench::setup;
using fogo::bench::Setup;
using fogo::bench::Shape;
using fogo::bench::time_steps;

// The wide orientation [m, n] (m <= n) of each of a parameter's `heads` matrices (its rows cut
// into that many equal blocks).
std::pair<int64_t, int64_t> wide(const Shape& shape, int64_t heads = 1) {
  const int64_t cols = c10::multiply_integers(shape) / shape[0], rows = shape[0] / heads;
  return {std::min(rows, cols), std::max(rows, cols)};
}

// Newton–Schulz FLOPs of one optimizer step over the set, routed as the optimizers route them:
// fogo::Muon one chain per matrix (Gram where Auto finds it cheaper); FOGO both streams, the fast
// one as P_f = NS(B_f) Pi through the Gram route where orthogonalize() takes it.
double muon_ns_flops(int64_t set, const fogo::MuonOptions& o) {
  double macs = 0;
  for (const Shape& shape : model_shapes(set)) {
    const auto [m, n] = wide(shape, o.heads());
    const bool gram =
        o.ns_form() == fogo::NSForm::Gram ||
        (o.ns_form() == fogo::NSForm::Auto &&
         fogo::newton_schulz_gram_is_cheaper(m, n, o.ns_steps(), o.ns_gram_restart()));
    macs += o.heads() * fogo::newton_schulz_macs(m, n, o.ns_steps(), gram, o.ns_gram_restart());
  }
  return 2 * macs;
}
double fogo_ns_flops(int64_t set, const fogo::FOGOOptions& o) {
  const bool full = o.ns_dtype() == torch::kFloat || o.ns_dtype() == torch::kDouble;
  const bool allowed = full || (o.ns_form() != fogo::NSForm::Plain && o.ns_gram_restart() > 0);
  const auto gram_of = [&](int64_t m, int64_t n, int64_t steps) {
    return o.ns_form() == fogo::NSForm::Gram ||
           (o.ns_form() == fogo::NSForm::Auto &&
            fogo::newton_schulz_gram_is_cheaper(m, n, steps, o.ns_gram_restart()));
  };
  double macs = 0;
  for (const Shape& shape : model_shapes(set)) {
    const auto [m, n] = wide(shape, o.heads());
    const int64_t d = o.proj_dim(), ks = o.ns_steps_slow(), kf = o.ns_steps_fast();
    double per = fogo::newton_schulz_macs(m, n, ks, gram_of(m, n, ks), o.ns_gram_restart());
    if (allowed && fogo::newton_schulz_projected_is_cheaper(m, n, d, kf, o.ns_gram_restart())) {
      per += fogo::newton_schulz_projected_macs(m, n, d, kf, true, o.ns_gram_restart()) - m * n * d;
    } else {
      per += fogo::newton_schulz_macs(m, n, kf, gram_of(m, n, kf), o.ns_gram_restart());
    }
    macs += o.heads() * per;
  }
  return 2 * macs;
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor>, int64_t set, torch::ScalarType)>;

// With the step's Newton–Schulz FLOPs as "TFLOP/s" (NS arithmetic over the whole step's time:
// the step's distance from spending all its time in NS at the device's peak).
void optimizer_step(benchmark::State& state, const Factory& make) {
  const Setup s = setup(state);
  if (!s.ok) return;
  auto params = make_params(state.range(0), s.device);
  auto opt = make(params, state.range(0), s.ns_dtype);
  time_steps(state, s.device, 2, [&] { opt->step(); });
  const auto& options = opt->param_groups()[0].options();
  // ns_dtype auto and ns_form Default as the step resolved them (the routes depend on them).
  if (const auto* f = dynamic_cast<const fogo::FOGOOptions*>(&options)) {
    fogo::FOGOOptions resolved = *f;
    resolved.ns_form(fogo::resolve_ns_form(f->ns_form(), f->ns_dtype(), s.device))
        .ns_dtype(fogo::resolve_ns_dtype(f->ns_dtype(), s.device));
    set_traffic(state, 0, fogo_ns_flops(state.range(0), resolved));
  } else if (const auto* m = dynamic_cast<const fogo::MuonOptions*>(&options)) {
    fogo::MuonOptions resolved = *m;
    resolved.ns_form(fogo::resolve_ns_form(m->ns_form(), m->ns_dtype(), s.device));
    set_traffic(state, 0, muon_ns_flops(state.range(0), resolved));
  }
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
// Graph steps under the default Raise (the flag read back before each replay): with
// BM_Step_FOGOMask, every graph/eager ratio compares one policy (issue 44).
void BM_Step_FOGOGraphRaise(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).cuda_graph(true));
  });
}
// Both streams through the Gram form with restarts where the cost model says it is cheaper
// (ns_form Auto; the fast stream as P_f = O_f Pi): the data for choosing the default form.
void BM_Step_FOGOAuto(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).ns_form(fogo::NSForm::Auto));
  });
}
// Every shape through the Gram form with restarts (ns_form Gram): with Plain, the two forms Auto
// chooses between (issue 26's "Auto / min(Plain, Gram)").
void BM_Step_FOGOGram(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).ns_form(fogo::NSForm::Gram));
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
// Eager Mask and graph Raise (issue 44): BM_Step_MuonGraph / BM_Step_MuonMask and
// BM_Step_MuonGraphRaise / BM_Step_Muon each compare one non-finite policy.
void BM_Step_MuonMask(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(
        p, fogo::MuonOptions(0.02).ns_dtype(dt).nonfinite(fogo::NonFinitePolicy::Mask));
  });
}
void BM_Step_MuonGraphRaise(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt).cuda_graph(true));
  });
}
// NorMuon on (issue 44: a CPU row per new path, so a regression shows without a GPU).
void BM_Step_MuonNorMuon(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt).normuon(true));
  });
}
void BM_Step_FOGONorMuon(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).normuon(true));
  });
}
// Every matrix cut into 2 row blocks (heads 2: each block its own matrix, as a fused qkv's
// heads; every row count of both sets, ResNet's fc's 10 included, divides by 2).
void BM_Step_MuonHeads(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt).heads(2));
  });
}
void BM_Step_FOGOHeads(benchmark::State& state) {
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).heads(2));
  });
}
void BM_Step_MuonAuto(benchmark::State& state) {  // as BM_Step_FOGOAuto
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(
        p, fogo::MuonOptions(0.02).ns_dtype(dt).ns_form(fogo::NSForm::Auto));
  });
}
void BM_Step_MuonGram(benchmark::State& state) {  // as BM_Step_FOGOGram
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(
        p, fogo::MuonOptions(0.02).ns_dtype(dt).ns_form(fogo::NSForm::Gram));
  });
}
void BM_Step_AdamW(benchmark::State& state) {  // the NS dtype argument is ignored
  optimizer_step(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  });
}

void step_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1, 2}) b->Args({set, device, dtype});
}
void graph_args(benchmark::internal::Benchmark* b) {
  for (int64_t set : {0, 1})
    for (int64_t dtype : {0, 1}) b->Args({set, 1, dtype});
}
void adamw_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1}) b->Args({set, device, 0});
}

BENCHMARK(BM_Step_FOGO)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOMask)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOGraph)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOGraphRaise)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGONorMuon)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOHeads)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOAuto)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOGram)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_FOGOFusionOnly)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_Muon)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonAuto)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonGram)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonGraph)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonMask)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonGraphRaise)->Apply(graph_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonNorMuon)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_MuonHeads)->Apply(step_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_AdamW)->Apply(adamw_args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

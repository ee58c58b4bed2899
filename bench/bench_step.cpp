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
// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32, 2 auto:
// the optimizers' default; steps only)[, stage].
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fogo_private/fogo/projection.h"
#include "fogo_private/fogo/stages.h"
#include "fogo_private/ops/ops.h"
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
  s.ns_dtype = state.range(2) == 0   ? torch::kBFloat16
               : state.range(2) == 1 ? torch::kFloat
                                     : fogo::kNSDtypeAuto;
  if (s.device.is_cuda() && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    s.ok = false;
  }
  state.SetLabel(std::string(set_name(state.range(0))) + (s.device.is_cuda() ? " cuda" : " cpu") +
                 " ns-" + fogo::ns_dtype_name(s.ns_dtype));
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

// Counters beside the time, so that a run shows each stage's distance from its roof without
// arithmetic by hand: "bytes" (per call) is the traffic the stage cannot avoid, every input read
// once and every output written once (its floor; a kernel that reads twice moves more), "GB/s"
// that over the measured time; "flop" and "TFLOP/s" the arithmetic of the GEMMs (2 per
// multiply-add; Newton–Schulz as newton_schulz_macs counts it). Compare GB/s with the device's
// memory bandwidth (H100 SXM: 3.35 TB/s) and TFLOP/s with its peak (bf16 dense: 989).
void set_traffic(benchmark::State& state, double bytes, double flops) {
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

double element_bytes(torch::ScalarType type) { return static_cast<double>(c10::elementSize(type)); }

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

// ---------------------------------------------------------------------------------------------
// FOGO's step by stage: each stage of docs/algorithm.md run alone on inputs of the real shapes,
// through the optimizer's own routing (src/fogo_private/fogo/stages.h: its batching by shape, its
// Newton–Schulz routes, projections and lift matrices), so that what is timed is what the step
// runs.

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
  fogo::Projection proj;       // Pi and its lift matrices, as the optimizer makes them
  bool gram;                   // the fast stream takes the Gram route (the optimizer's choice)
  torch::Tensor input;         // step 2's input [2P, m, n]: P slow streams, P fast ones
  fogo::stages::RunStreams O;  // what step 2 gives, for step 3
};

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
  for (const auto& [mn, members] : groups) {
    const auto [m, n] = mn;
    const int64_t P = static_cast<int64_t>(members.size());
    Bucket b{m,
             n,
             fogo::make_projection(o, n, s.device),
             false,
             torch::randn({2 * P, m, n}, f32).to(s.ns_dtype),
             {}};
    b.gram = fogo::stages::fast_stream_takes_gram(b.input.slice(0, P), b.proj, o);
    b.O = fogo::stages::orthogonalize_run(b.input, b.gram ? &b.proj : nullptr, o);
    buckets.push_back(std::move(b));
    R += P * m;
  }
  // The stage's floor traffic and GEMM FLOPs (set_traffic).
  const double xb = element_bytes(s.ns_dtype), f4 = 4;
  double weights = 0, ns_flops = 0, ns_bytes = 0, proj_bytes = 0, proj_flops = 0, lift_bytes = 0,
         lift_flops = 0;
  for (const auto& b : buckets) {
    const auto P = static_cast<double>(b.input.size(0) / 2), m = static_cast<double>(b.m),
               n = static_cast<double>(b.n), dd = static_cast<double>(d);
    weights += P * m * n;
    // NS: the slow chain, the fast one (or the fast Gram route to P_f); inputs read (fp32 here),
    // outputs written in the compute dtype ([P m, d] fp32 for the Gram route).
    ns_flops += 2 * P *
                (fogo::newton_schulz_macs(b.m, b.n, o.ns_steps_slow(), false, 0) +
                 (b.gram ? fogo::newton_schulz_projected_macs(b.m, b.n, d, o.ns_steps_fast(), true,
                                                              o.ns_gram_restart())
                         : fogo::newton_schulz_macs(b.m, b.n, o.ns_steps_fast(), false, 0)));
    ns_bytes += P * m * n * (2 * f4 + xb) + (b.gram ? P * m * dd * f4 : P * m * n * xb);
    // Project: O read, Pi read, P [P m, d] fp32 written, once per stream that takes it.
    const double streams = b.gram ? 1 : 2;
    proj_bytes += streams * (P * m * n * xb + P * m * dd * f4) + n * dd * xb;
    proj_flops += streams * 2 * P * m * n * dd;
    // Lift: dz rows read, K read, delta [P m, n] fp32 written.
    lift_bytes += P * m * dd * f4 + n * dd * xb + P * m * n * f4;
    lift_flops += 2 * P * m * n * dd;
  }
  const double Rd = static_cast<double>(R * d), Cd = static_cast<double>(C * d);
  switch (stage) {
    case kMomenta:  // G, Bs, Bf read; Bs, Bf and both NS inputs written
      set_traffic(state, weights * (5 * f4 + 2 * xb), 0);
      break;
    case kNs:
      set_traffic(state, ns_bytes, ns_flops);
      break;
    case kProject:
      set_traffic(state, proj_bytes, proj_flops);
      break;
    case kProjected:  // Ps, Pf, cbar read; dz, q written; sim = q cbar^T
    case kProjectedLt48: {
      const double K = stage == kProjectedLt48 ? 48 : 0;
      set_traffic(state, 4 * Rd * f4 + (Cd + K * d) * f4,
                  2 * Rd * static_cast<double>(C) + 2 * 2 * Rd * K);
      break;
    }
    case kLift:
      set_traffic(state, lift_bytes, lift_flops);
      break;
    case kUpdate:  // parameter read and written, O_s and delta read
      set_traffic(state, weights * (2 * f4 + xb + f4), 0);
      break;
    case kFlush:  // S read and written, s, prev read, centroids written; N, m
      set_traffic(state, 5 * Cd * f4 + 3 * static_cast<double>(C) * f4,
                  2 * Cd * static_cast<double>(C + o.r_dec()));  // corr [C, C], the r neighbours
      break;
    default:
      break;
  }

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
          benchmark::DoNotOptimize(
              fogo::stages::orthogonalize_run(b.input, b.gram ? &b.proj : nullptr, o).Os);
        }
      };
      break;
    case kProject: {
      std::vector<std::pair<torch::Tensor, torch::Tensor>> out;  // each bucket's P_s, P_f rows
      for (const auto& b : buckets) {
        out.push_back({torch::empty({b.O.Os.size(0) * b.m, d}, f32),
                       torch::empty({b.O.Os.size(0) * b.m, d}, f32)});
      }
      run = [&, out]() mutable {
        for (size_t k = 0; k < buckets.size(); ++k) {
          fogo::stages::project_rows(buckets[k].O.Os, buckets[k].proj, out[k].first);
          if (!buckets[k].gram) {
            fogo::stages::project_rows(buckets[k].O.Of, buckets[k].proj, out[k].second);
          }
        }
      };
      break;
    }
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
        work.push_back(
            {torch::randn({b.O.Os.size(0) * b.m, d}, f32), fogo::stages::lift_matrix(b.proj, o)});
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
void stage_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1})
        for (int64_t stage = 0; stage < kNumStages; ++stage) b->Args({set, device, dtype, stage});
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
BENCHMARK(BM_Stage_FOGO)->Apply(stage_args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

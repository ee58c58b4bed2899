// Google Benchmark (part of fogo_bench): FOGO's step by stage, the profile breakdown of
// docs/benchmarks.md. Each stage of docs/algorithm.md runs alone on inputs of the real shapes,
// through the optimizer's own routing (src/fogo_private/fogo/stages.h: its batching by shape, its
// Newton–Schulz routes, projections and lift matrices), so that what is timed is what the step
// runs. The model sets and presets are bench_step.cpp's.
//
// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32), stage (the
// Stage enum below; bench/targets.py reads kNs's number).
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "fogo_private/fogo/projection.h"
#include "fogo_private/fogo/stages.h"
#include "fogo_private/ops/ops.h"
#include "model_sets.h"

namespace {

using fogo::bench::fogo_preset;
using fogo::bench::model_shapes;
using fogo::bench::set_name;
using fogo::bench::set_traffic;
using fogo::bench::Shape;

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

double element_bytes(torch::ScalarType type) { return static_cast<double>(c10::elementSize(type)); }

struct Bucket {
  int64_t m, n;
  fogo::Projection proj;       // Pi and its lift matrices, as the optimizer makes them
  bool gram;                   // the fast stream takes the Gram route (the optimizer's choice)
  torch::Tensor input;         // step 2's input [2P, m, n]: P slow streams, P fast ones
  fogo::stages::RunStreams O;  // what step 2 gives, for step 3
};

// What every stage of one row works on: the preset, the set's shapes and their buckets by shape.
struct StageInputs {
  fogo::FOGOOptions o;
  torch::TensorOptions f32;
  torch::ScalarType ns_dtype;
  int64_t set, d, C;
  std::vector<Shape> shapes;
  std::vector<Bucket> buckets;
  int64_t R = 0;  // rows of all the set's matrices in their working orientation
};

// The working orientation of every parameter, grouped by shape as the optimizer does, with each
// bucket's projection, step 2's input and its output.
void make_buckets(StageInputs& in, const torch::Device& device) {
  std::map<std::pair<int64_t, int64_t>, std::vector<Shape>> groups;
  for (const Shape& shape : in.shapes) {
    const int64_t rows = shape[0], cols = c10::multiply_integers(shape) / rows;
    groups[{std::min(rows, cols), std::max(rows, cols)}].push_back(shape);
  }
  for (const auto& [mn, members] : groups) {
    const auto [m, n] = mn;
    const int64_t P = static_cast<int64_t>(members.size());
    Bucket b{m,
             n,
             fogo::make_projection(in.o, n, device),
             false,
             torch::randn({2 * P, m, n}, in.f32).to(in.ns_dtype),
             {}};
    b.gram = fogo::stages::fast_stream_takes_gram(b.input.slice(0, P), b.proj, in.o);
    b.O = fogo::stages::orthogonalize_run(b.input, b.gram ? &b.proj : nullptr, in.o);
    in.buckets.push_back(std::move(b));
    in.R += P * m;
  }
}

// The floor traffic and GEMM FLOPs of the bucketed stages (NS, project, lift), summed over the
// buckets, and the weights of the set.
struct BucketTraffic {
  double weights = 0, ns_flops = 0, ns_bytes = 0, proj_bytes = 0, proj_flops = 0, lift_bytes = 0,
         lift_flops = 0;
};

BucketTraffic bucket_traffic(const StageInputs& in) {
  const double xb = element_bytes(in.ns_dtype), f4 = 4;
  const auto& o = in.o;
  BucketTraffic t;
  for (const auto& b : in.buckets) {
    const auto P = static_cast<double>(b.input.size(0) / 2), m = static_cast<double>(b.m),
               n = static_cast<double>(b.n), dd = static_cast<double>(in.d);
    t.weights += P * m * n;
    // NS: the slow chain, the fast one (or the fast Gram route to P_f); inputs read (fp32 here),
    // outputs written in the compute dtype ([P m, d] fp32 for the Gram route).
    t.ns_flops += 2 * P *
                  (fogo::newton_schulz_macs(b.m, b.n, o.ns_steps_slow(), false, 0) +
                   (b.gram ? fogo::newton_schulz_projected_macs(b.m, b.n, in.d, o.ns_steps_fast(),
                                                                true, o.ns_gram_restart())
                           : fogo::newton_schulz_macs(b.m, b.n, o.ns_steps_fast(), false, 0)));
    t.ns_bytes += P * m * n * (2 * f4 + xb) + (b.gram ? P * m * dd * f4 : P * m * n * xb);
    // Project: O read, Pi read, P [P m, d] fp32 written, once per stream that takes it.
    const double streams = b.gram ? 1 : 2;
    t.proj_bytes += streams * (P * m * n * xb + P * m * dd * f4) + n * dd * xb;
    t.proj_flops += streams * 2 * P * m * n * dd;
    // Lift: dz rows read, K read, delta [P m, n] fp32 written.
    t.lift_bytes += P * m * dd * f4 + n * dd * xb + P * m * n * f4;
    t.lift_flops += 2 * P * m * n * dd;
  }
  return t;
}

// The stage's floor traffic and GEMM FLOPs as counters (set_traffic).
void set_stage_traffic(benchmark::State& state, int64_t stage, const StageInputs& in) {
  const BucketTraffic t = bucket_traffic(in);
  const double xb = element_bytes(in.ns_dtype), f4 = 4;
  const double Rd = static_cast<double>(in.R * in.d), Cd = static_cast<double>(in.C * in.d);
  switch (stage) {
    case kMomenta:  // G, Bs, Bf read; Bs, Bf and both NS inputs written
      set_traffic(state, t.weights * (5 * f4 + 2 * xb), 0);
      break;
    case kNs:
      set_traffic(state, t.ns_bytes, t.ns_flops);
      break;
    case kProject:
      set_traffic(state, t.proj_bytes, t.proj_flops);
      break;
    case kProjected:  // Ps, Pf, cbar read; dz, q written; sim = q cbar^T
    case kProjectedLt48: {
      const double K = stage == kProjectedLt48 ? 48 : 0;
      set_traffic(state, 4 * Rd * f4 + (Cd + K * static_cast<double>(in.d)) * f4,
                  2 * Rd * static_cast<double>(in.C) + 2 * 2 * Rd * K);
      break;
    }
    case kLift:
      set_traffic(state, t.lift_bytes, t.lift_flops);
      break;
    case kUpdate:  // parameter read and written, O_s and delta read
      set_traffic(state, t.weights * (2 * f4 + xb + f4), 0);
      break;
    case kFlush:  // S read and written, s, prev read, centroids written; N, m
      set_traffic(state, 5 * Cd * f4 + 3 * static_cast<double>(in.C) * f4,
                  2 * Cd * static_cast<double>(in.C + in.o.r_dec()));  // corr [C, C], r neighbours
      break;
    default:
      break;
  }
}

// Both momenta and the NS inputs, as the step writes them.
std::function<void()> momenta_run(const StageInputs& in) {
  std::vector<fogo::MomentaItem> items;
  for (const Shape& shape : in.shapes) {
    const int64_t rows = shape[0], cols = c10::multiply_integers(shape) / rows;
    const auto x_shape =
        rows > cols ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
    items.push_back({torch::zeros(shape, in.f32), torch::zeros(shape, in.f32),
                     torch::randn(shape, in.f32), torch::empty(x_shape, in.f32.dtype(in.ns_dtype)),
                     torch::empty(x_shape, in.f32.dtype(in.ns_dtype)), rows > cols});
  }
  const auto o = in.o;
  return [=] { fogo::ops::momenta_step(items, o.mu_s(), o.mu_f(), {}); };
}

// Step 2 on every bucket (`in` must outlive the function).
std::function<void()> ns_run(const StageInputs& in) {
  return [&in] {
    for (const auto& b : in.buckets) {
      benchmark::DoNotOptimize(
          fogo::stages::orthogonalize_run(b.input, b.gram ? &b.proj : nullptr, in.o).Os);
    }
  };
}

// Step 3 on every bucket: P_s, and P_f unless the Gram route gave it (`in` must outlive it).
std::function<void()> project_run(const StageInputs& in) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;  // each bucket's P_s, P_f rows
  for (const auto& b : in.buckets) {
    out.push_back({torch::empty({b.O.Os.size(0) * b.m, in.d}, in.f32),
                   torch::empty({b.O.Os.size(0) * b.m, in.d}, in.f32)});
  }
  return [&in, out]() mutable {
    for (size_t k = 0; k < in.buckets.size(); ++k) {
      const Bucket& b = in.buckets[k];
      fogo::stages::project_rows(b.O.Os, b.proj, out[k].first);
      if (!b.gram) fogo::stages::project_rows(b.O.Of, b.proj, out[k].second);
    }
  };
}

// Steps 4-7 with `K` frozen candidates.
std::function<void()> projected_run(const StageInputs& in, int64_t K) {
  const auto& f32 = in.f32;
  const int64_t R = in.R, d = in.d;
  const auto Ps = torch::randn({R, d}, f32) * 4, Pf = Ps + torch::randn({R, d}, f32) * 4;
  const auto cbar = fogo::normalize_rows(torch::randn({in.C, d}, f32), 0.0);
  const auto frozen = fogo::normalize_rows(torch::randn({K, d}, f32), 0.0);
  const auto nu = torch::full({K}, 1.0 / 48, f32);
  const auto rbar = torch::zeros({}, f32);
  const auto p = fogo::projected_step_params(in.o, /*filter=*/true);
  return [=] {
    benchmark::DoNotOptimize(fogo::ops::projected_step(Ps, Pf, cbar, frozen, nu, rbar, p).dz);
  };
}

// Step 8: one GEMM per shape run, its rows [P m, d], K in the step's precision.
std::function<void()> lift_run(const StageInputs& in) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> work;
  for (const auto& b : in.buckets) {
    work.push_back({torch::randn({b.O.Os.size(0) * b.m, in.d}, in.f32),
                    fogo::stages::lift_matrix(b.proj, in.o)});
  }
  return [=] {
    for (const auto& [dz, K] : work) benchmark::DoNotOptimize(fogo::proximal_lift(dz, K));
  };
}

// Step 9 on the whole set in one call.
std::function<void()> update_run(const StageInputs& in, const torch::Device& device) {
  auto params = fogo::bench::make_params(in.set, device);
  std::vector<fogo::RmsUpdateItem> items;
  for (const auto& p : params) {
    const int64_t rows = p.size(0), cols = p.numel() / rows;
    const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
    // O_s in the NS compute dtype, as the optimizer passes it.
    items.push_back({p, torch::randn({m, n}, in.f32).to(in.ns_dtype),
                     0.1 * torch::randn({m, n}, in.f32), rows > cols});
  }
  const auto o = in.o;
  return [=]() mutable {
    torch::NoGradGuard no_grad;
    benchmark::DoNotOptimize(
        fogo::ops::apply_rms_update(items, {o.lr(), o.weight_decay(), o.sigma(), o.eps()}));
  };
}

std::function<void()> flush_run(const StageInputs& in) {
  const auto& f32 = in.f32;
  fogo::Codebook book{fogo::normalize_rows(torch::randn({in.C, in.d}, f32), 0.0),
                      torch::rand({in.C, in.d}, f32), torch::rand({in.C}, f32)};
  const fogo::Assignments acc{torch::rand({in.C}, f32) * 100, torch::randn({in.C, in.d}, f32)};
  const auto o = in.o;
  return [=]() mutable {
    fogo::ops::codebook_flush(book, acc, {o.beta_cb(), o.lambda_c(), o.eps(), o.r_dec()});
  };
}

std::function<void()> stage_run(int64_t stage, const StageInputs& in, const torch::Device& device) {
  switch (stage) {
    case kMomenta:
      return momenta_run(in);
    case kNs:
      return ns_run(in);
    case kProject:
      return project_run(in);
    case kProjected:
    case kProjectedLt48:
      return projected_run(in, stage == kProjectedLt48 ? 48 : 0);
    case kLift:
      return lift_run(in);
    case kUpdate:
      return update_run(in, device);
    case kFlush:
      return flush_run(in);
    default:
      return {};
  }
}

void BM_Stage_FOGO(benchmark::State& state) {
  const fogo::bench::Setup s = fogo::bench::setup(state);
  if (!s.ok) return;
  const int64_t set = state.range(0), stage = state.range(3);
  state.SetLabel(std::string(kStageNames[stage]) + " " + set_name(set) +
                 (s.device.is_cuda() ? " cuda" : " cpu") +
                 (s.ns_dtype == torch::kFloat ? " ns-fp32" : " ns-bf16"));
  const auto o = fogo_preset(set, s.ns_dtype);
  StageInputs in{o,
                 torch::TensorOptions().dtype(torch::kFloat).device(s.device),
                 s.ns_dtype,
                 set,
                 o.proj_dim(),
                 o.codebook_size(),
                 model_shapes(set),
                 {}};
  torch::manual_seed(0);
  make_buckets(in, s.device);
  set_stage_traffic(state, stage, in);
  fogo::bench::time_steps(state, s.device, 1, stage_run(stage, in, s.device));
}

void stage_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1})
        for (int64_t stage = 0; stage < kNumStages; ++stage) b->Args({set, device, dtype, stage});
}

BENCHMARK(BM_Stage_FOGO)->Apply(stage_args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

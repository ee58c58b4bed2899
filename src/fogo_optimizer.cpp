// fogo::FOGO: the step of ALGORITHM.md, stage by stage, in ATen operations (any device).
// The stage functions live in projection.h (Pi, lift), projected.h (slerp, filters) and
// codebook.h (memory); this file orchestrates them per codebook group and owns the state.
#include "fogo/fogo_optimizer.h"

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "fogo/codebook.h"
#include "fogo/detail/batching.h"
#include "fogo/detail/checks.h"
#include "fogo/ops.h"
#include "fogo/projected.h"
#include "fogo/projection.h"
#include "fogo_state.h"

namespace fogo {

ProjectedStepParams projected_step_params(const FOGOOptions& o, bool filter) {
  return {o.xi(),
          o.eps(),
          {o.eps_st(), o.tau_plus(), o.tau_minus()},
          o.lambda_hi(),
          o.gamma_hi(),
          o.gamma_st_min(),
          o.gamma_st_max(),
          o.beta_r(),
          o.kappa(),
          {o.eps_lt(), o.gamma_lt(), o.eps(), o.spectral_scaling()},
          filter};
}

// ---------------------------------------------------------------------------------------------
// Param state

void FOGOParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(slow_momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fast_momentum);
}

void FOGOParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, slow_momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, fast_momentum);
}

bool operator==(const FOGOParamState& a, const FOGOParamState& b) {
  const auto same = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
  };
  return same(a.slow_momentum(), b.slow_momentum()) && same(a.fast_momentum(), b.fast_momentum());
}

namespace {

// One matrix parameter in the working orientation [m, n], m <= n (the projected side n is the
// larger one; ALGORITHM.md "Shapes").
struct Work {
  at::Tensor param;
  bool transposed;
  int64_t m, n;
  at::Tensor slow, fast;  ///< the momenta B_s, B_f (state, in the parameter's shape)
  at::Tensor G;           ///< the gradient in fp32
  at::Tensor Os;  ///< orthogonalized slow stream in the NS compute dtype (the fast one is only
                  ///< ever projected)
  const Projection* proj;
};

// [begin, end) of each run of same-shape parameters in `work`: a run shares Pi and goes through
// Newton–Schulz, the projection and the lift as one batch (detail/batching.h).
using ShapeRuns = detail::Runs;

}  // namespace

namespace {

// `first`: the group's first parameter. A group shares one codebook, kept on one device.
void check_matrix(size_t group, size_t index, const at::Tensor& p, const at::Tensor& first,
                  const FOGOOptions& o) {
  TORCH_CHECK(p.dim() >= 2, "FOGO handles matrices and N-D weights, but ",
              detail::describe_param(group, index, p),
              " has fewer than 2 dimensions; optimize it with AdamW (see fogo::split_parameters)");
  TORCH_CHECK(p.device() == first.device(), "FOGO: the parameters of a param group share one ",
              "codebook and must be on one device, but ", detail::describe_param(group, index, p),
              " is on ", p.device(), " and the group's first parameter on ", first.device(),
              "; put each device's parameters in a param group of their own");
  if (o.cuda_graph()) detail::check_graph_device("FOGO", group, index, p);
}

}  // namespace

FOGO::FOGO(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, FOGOOptions defaults)
    : Optimizer(param_groups, std::make_unique<FOGOOptions>(defaults)),
      impl_(std::make_unique<Impl>()) {
  defaults.validate();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const FOGOOptions&>(param_groups_[g].options());
    options.validate();
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      check_matrix(g, i, param_groups_[g].params()[i], param_groups_[g].params()[0], options);
    }
  }
}

FOGO::~FOGO() = default;
FOGO::FOGO(FOGO&&) noexcept = default;
FOGO& FOGO::operator=(FOGO&&) noexcept = default;

// ---------------------------------------------------------------------------------------------
// The step

namespace {

// Steps 2-3 for a whole group, per run of same-shape parameters (m, n) of the working
// orientation: the slow streams of the run through one batched Newton–Schulz chain, the fast
// streams likewise (both in one chain when K_s == K_f and the fast one takes the plain route),
// and the projections P = O Pi as one GEMM per run and stream. Sets each w.Os and returns
// (Ps, Pf) [R, d] fp32 with the rows in `work` order.
//
// The chains' inputs `inputs` (one [2P, m, n] per run: the slow streams, then the fast ones) were
// written by step 1 in the compute dtype, and O_s stays in that dtype: the update reads it as is.
//
// Only P_f = O_f Pi of the fast stream is ever used: newton_schulz_projected computes it from
// m x m Gram iterations when that takes fewer multiply-adds: always with fp32/fp64 compute, and
// with bf16/fp16 compute when ns_form lets the Gram form in (Gram or Auto) with restarts (without
// them the Gram matrix squares the conditioning and low precision loses the small directions;
// newton_schulz.h).
//
// With unit-scale Pi (entries +-1, exact in bf16), a bf16 O times Pi is exact products summed in
// fp32 (mm_bf16_f32): tensor cores on CUDA, the same result up to summation order.
std::pair<at::Tensor, at::Tensor> orthogonalize(std::vector<Work>& work, const ShapeRuns& runs,
                                                const std::vector<at::Tensor>& inputs,
                                                const FOGOOptions& o) {
  if (runs.empty()) return {};  // a shard that owns none of the group
  const bool full_precision = o.ns_dtype() == at::kFloat || o.ns_dtype() == at::kDouble;
  const bool gram_allowed =
      full_precision || (o.ns_form() != NSForm::Plain && o.ns_gram_restart() > 0);
  int64_t R = 0;
  for (const Work& w : work) R += w.m;
  // The projections are written straight into their rows of Ps and Pf (no cat of the runs).
  at::Tensor Ps = at::empty({R, o.proj_dim()}, work.front().slow.options());
  at::Tensor Pf = at::empty_like(Ps);
  int64_t row = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [begin, end] = runs[r];
    const int64_t m = work[begin].m, n = work[begin].n;
    const int64_t P = static_cast<int64_t>(end - begin);
    const Projection& proj = *work[begin].proj;
    at::Tensor Ps_rows = Ps.slice(0, row, row + P * m), Pf_rows = Pf.slice(0, row, row + P * m);
    row += P * m;
    const auto project = [&](const at::Tensor& O, at::Tensor& out) {  // [P, m, n] -> [P m, d]
      const at::Tensor rows = O.reshape({-1, n});
      if (O.scalar_type() == at::kBFloat16 && proj.Pi_bf16.defined()) {
        mm_bf16_f32_out(out, rows, proj.Pi_bf16);
      } else {
        at::mm_out(out, rows.to(at::kFloat), proj.Pi);
      }
    };
    const at::Tensor Bf = inputs[r].slice(0, P);
    const NSConfig ns_fast = ns_config(o, o.ns_steps_fast());
    // The fast stream through the Gram route with its projection, or the plain chain then the
    // projection: with ns_form Auto decided as Auto decides (timed on the GPU at the first sight
    // of the shape, the cost model on the CPU: the same answer as below there), with Gram by the
    // cost model.
    const bool gram =
        gram_allowed && (o.ns_form() == NSForm::Auto
                             ? newton_schulz_projected_auto(Bf, proj.Pi, ns_fast)
                             : newton_schulz_projected_is_cheaper(
                                   m, n, o.proj_dim(), o.ns_steps_fast(), o.ns_gram_restart()));
    at::Tensor Os;
    if (!gram && o.ns_steps_slow() == o.ns_steps_fast()) {
      const at::Tensor O = newton_schulz(inputs[r], ns_config(o, o.ns_steps_slow()));
      Os = O.slice(0, 0, P);
      project(Os, Ps_rows);
      project(O.slice(0, P), Pf_rows);
    } else {
      Os = newton_schulz(inputs[r].slice(0, 0, P), ns_config(o, o.ns_steps_slow()));
      project(Os, Ps_rows);
      if (gram) {
        Pf_rows.copy_(newton_schulz_projected(Bf, proj.Pi, ns_fast).reshape({-1, o.proj_dim()}));
      } else {
        project(newton_schulz(Bf, ns_fast), Pf_rows);
      }
    }
    for (int64_t k = 0; k < P; ++k) work[begin + k].Os = Os[k];
  }
  return {Ps, Pf};
}

// The parameters this rank steps through the per-parameter stages (2-3, 8-9): all of them, or
// under data-parallel sharding (StepShard) the owned ones, each run keeping its order.
struct Share {
  std::vector<Work> work;
  ShapeRuns runs;
  std::vector<size_t> index;  ///< into the group's work
  std::vector<int64_t> row;   ///< first row of each group parameter in the [R, d] matrices
  bool sharded = false;
};

Share share_of(const std::vector<Work>& work, const ShapeRuns& runs, const StepShard& shard) {
  Share s;
  s.sharded = static_cast<bool>(shard.owns);
  int64_t row = 0;
  for (const Work& w : work) {
    s.row.push_back(row);
    row += w.m;
  }
  for (const auto& [begin, end] : runs) {
    const size_t first = s.work.size();
    for (size_t i = begin; i < end; ++i) {
      if (s.sharded && !shard.owns(work[i].param)) continue;
      s.work.push_back(work[i]);
      s.index.push_back(i);
    }
    if (s.work.size() > first) s.runs.push_back({first, s.work.size()});
  }
  return s;
}

// Under sharding: every parameter's (P_s, P_f) rows from its owner, in the group's row order.
std::pair<at::Tensor, at::Tensor> share_projections(const std::vector<Work>& work, const Share& s,
                                                    const at::Tensor& Ps, const at::Tensor& Pf,
                                                    const FOGOOptions& o, const StepShard& shard) {
  std::vector<at::Tensor> params;
  std::vector<std::vector<at::Tensor>> values;
  for (const Work& w : work) {
    params.push_back(w.param);
    const auto buffer = [&] { return at::empty({w.m, o.proj_dim()}, w.slow.options()); };
    values.push_back({buffer(), buffer()});
  }
  int64_t row = 0;
  for (size_t k = 0; k < s.work.size(); ++k) {
    const int64_t m = s.work[k].m;
    values[s.index[k]] = {Ps.slice(0, row, row + m), Pf.slice(0, row, row + m)};
    row += m;
  }
  shard.exchange(params, values);
  std::vector<at::Tensor> all_s, all_f;
  for (const auto& v : values) {
    all_s.push_back(v[0]);
    all_f.push_back(v[1]);
  }
  return {at::cat(all_s), at::cat(all_f)};
}

// The rows of R-row `dz` that belong to the share's parameters, in the share's order.
at::Tensor rows_of(const at::Tensor& dz, const Share& s) {
  if (!s.sharded) return dz;
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < s.work.size(); ++k) {
    parts.push_back(dz.slice(0, s.row[s.index[k]], s.row[s.index[k]] + s.work[k].m));
  }
  return parts.empty() ? dz.slice(0, 0, 0) : at::cat(parts);
}

// Under sharding: every parameter and its delta ratio from its owner; returns the ratios of the
// whole group in its order.
std::vector<at::Tensor> share_updates(const std::vector<Work>& work, const Share& s,
                                      std::vector<at::Tensor> ratios, const StepShard& shard) {
  if (!s.sharded) return ratios;
  std::vector<at::Tensor> params, all(work.size());
  std::vector<std::vector<at::Tensor>> values;
  for (size_t k = 0; k < s.work.size(); ++k) all[s.index[k]] = ratios[k];
  for (size_t i = 0; i < work.size(); ++i) {
    params.push_back(work[i].param);
    if (!all[i].defined()) all[i] = at::empty({}, work[i].param.options().dtype(at::kFloat));
    values.push_back({work[i].param, all[i]});
  }
  shard.exchange(params, values);
  return all;
}

at::Tensor entropy(const at::Tensor& N) {
  const at::Tensor p = N / N.sum().clamp_min(1e-30);
  return -(p * at::log(p.clamp_min(1e-30))).sum();
}

// The stages of one group's step, in ALGORITHM.md's order (FOGO::step_group names them).

// Every parameter of the group that has elements (and a gradient): its momenta (created on its
// first step), fp32 gradient, working orientation and projection.
std::vector<Work> working_set(
    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
    ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& state,
    const std::function<const Projection&(int64_t n)>& projection) {
  std::vector<Work> work;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (p.numel() == 0) continue;  // nothing to update (and no rows to orthogonalize)
    auto& slot = state[p.unsafeGetTensorImpl()];
    if (!slot) {
      auto fresh = std::make_unique<FOGOParamState>();
      fresh->slow_momentum(at::zeros(p.sizes(), p.options().dtype(at::kFloat)));
      fresh->fast_momentum(at::zeros(p.sizes(), p.options().dtype(at::kFloat)));
      slot = std::move(fresh);
    }
    auto& st = static_cast<FOGOParamState&>(*slot);
    const int64_t rows = p.size(0), cols = p.numel() / rows;
    Work w{p,
           rows > cols,
           std::min(rows, cols),
           std::max(rows, cols),
           st.slow_momentum(),
           st.fast_momentum(),
           grads[k].to(at::kFloat),
           {},
           nullptr};
    if (projection) w.proj = &projection(w.n);  // none for fusion_only: Pi is never built
    work.push_back(std::move(w));
  }
  return work;
}

// The inputs of step 2's chains, one [2P, m, n] per run of the share in the NS compute dtype: the
// P slow streams, then the P fast ones (written by step 1).
std::vector<at::Tensor> ns_inputs(const std::vector<Work>& work, const ShapeRuns& runs,
                                  const FOGOOptions& o) {
  std::vector<at::Tensor> inputs;
  for (const auto& [begin, end] : runs) {
    inputs.push_back(
        at::empty({2 * static_cast<int64_t>(end - begin), work[begin].m, work[begin].n},
                  work[begin].slow.options().dtype(o.ns_dtype())));
  }
  return inputs;
}

// Step 1: both momenta of every parameter of the group, and, for the share's parameters, the NS
// inputs in the same pass (ops::momenta_step: one kernel per parameter on CUDA).
void update_momenta(const std::vector<Work>& work, const Share& s,
                    const std::vector<at::Tensor>& inputs, const FOGOOptions& o,
                    const at::Tensor& ok) {
  std::vector<MomentaItem> items;
  for (const Work& w : work) items.push_back({w.slow, w.fast, w.G, {}, {}, w.transposed});
  for (size_t r = 0; r < s.runs.size(); ++r) {
    const auto [begin, end] = s.runs[r];
    const int64_t P = static_cast<int64_t>(end - begin);
    for (size_t j = begin; j < end; ++j) {
      MomentaItem& item = items[s.index[j]];
      item.Xs = inputs[r][static_cast<int64_t>(j - begin)];
      item.Xf = inputs[r][P + static_cast<int64_t>(j - begin)];
    }
  }
  ops::momenta_step(items, o.mu_s(), o.mu_f(), ok);
}

// A group's first step: the codebook from that step's queries (ALGORITHM.md "First step").
void initialize_memory(GroupMemory& mem, const at::Tensor& Ps, const at::Tensor& Pf,
                       const FOGOOptions& o) {
  const at::Tensor z = slerp_fuse(Ps, Pf, o.xi(), o.eps());
  mem.book = init_codebook(normalize_rows(z, o.eps()), at::linalg_vector_norm(z, 2, {1}) > 0,
                           o.codebook_size(), mem.gen);
  mem.start = mem.book.centroids.clone();
  mem.rbar = at::zeros({}, z.options());
  mem.initialized = true;
}

// The keys of this step's draw of long-term candidates (step 7), from the group's CPU generator
// before any device work: undefined when the step protects against the whole frozen bank (it
// holds at most lt_candidates, or this is the group's first step).
at::Tensor draw_candidate_keys(GroupMemory& mem, const FOGOOptions& o, const c10::Device& device) {
  if (!mem.initialized || !mem.frozen.defined() || mem.frozen.size(0) <= o.lt_candidates())
    return {};
  return candidate_keys(mem.frozen.size(0), mem.gen, device);
}

// A_t: the frozen centroids this step protects against: the whole bank, or lt_candidates of it
// sampled by importance with `keys` (draw_candidate_keys).
std::pair<at::Tensor, at::Tensor> long_term_candidates(const GroupMemory& mem, const FOGOOptions& o,
                                                       const at::Tensor& keys) {
  if (!keys.defined()) return {mem.frozen, mem.frozen_nu};
  const at::Tensor pick = sample_candidates(mem.frozen_nu, o.lt_candidates(), keys);
  return {mem.frozen.index_select(0, pick), mem.frozen_nu.index_select(0, pick)};
}

// Step 8, the proximal lift of dz = zbar - Ps (one GEMM per shape run, at the NS precision:
// bf16 products when the NS computes in bf16), and step 9, the RMS-scaled update with decoupled
// decay, with o.lr() or, when defined, `device_lr` (a CUDA graph's), all parameters in one call
// (one set of launches per group on CUDA). Returns |delta|_F / |O_s|_F of each parameter, in
// `work` order. With `ok` (Mask), a parameter keeps its value where ok is false.
std::vector<at::Tensor> lift_and_update(const std::vector<Work>& work, const ShapeRuns& runs,
                                        const at::Tensor& dz, const FOGOOptions& o,
                                        const at::Tensor& device_lr, const at::Tensor& ok) {
  std::vector<RmsUpdateItem> items;
  int64_t row = 0;
  for (const auto& [begin, end] : runs) {
    const int64_t m = work[begin].m, n = work[begin].n;
    const int64_t rows = m * static_cast<int64_t>(end - begin);
    const Projection& proj = *work[begin].proj;
    const at::Tensor delta = proximal_lift(dz.slice(0, row, row + rows),
                                           o.ns_dtype() == at::kBFloat16 ? proj.K_bf16 : proj.K)
                                 .view({-1, m, n});
    row += rows;
    for (size_t i = begin; i < end; ++i) {
      items.push_back(
          {work[i].param, work[i].Os, delta[static_cast<int64_t>(i - begin)], work[i].transposed});
    }
  }
  return ops::apply_rms_update(items, {o.lr(), o.weight_decay(), o.sigma(), o.eps(), device_lr},
                               ok);
}

// fusion_only: steps 2 and 4 in parameter space, then step 9; nothing is projected, remembered
// or filtered. Per run, both streams through Newton–Schulz (one batched chain when K_s == K_f,
// as orthogonalize()), the rows of the working orientation fused by slerp_fuse (fp32, or fp64
// with fp64 Newton–Schulz):
// Ohat_i = |Os_i| Slerp(Os_i, Of_i; xi), and the RMS update of Ohat, given to apply_rms_update
// as O_s plus delta = Ohat - O_s (so its telemetry ratio is |delta| / |O_s|, as full FOGO's).
// Full FOGO with its memory switched off (gamma_hi = gamma_st = gamma_lt = 0) fuses the same
// streams in the projected space and lifts the difference back: the same direction where Pi
// Pi^T ~ d I, not the same computation (it rounds differently even at xi = 0).
std::vector<at::Tensor> fuse_and_update(const std::vector<Work>& work, const ShapeRuns& runs,
                                        const std::vector<at::Tensor>& inputs, const FOGOOptions& o,
                                        const at::Tensor& device_lr, const at::Tensor& ok) {
  std::vector<RmsUpdateItem> items;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [begin, end] = runs[r];
    const int64_t P = static_cast<int64_t>(end - begin);
    const int64_t m = work[begin].m, n = work[begin].n;
    at::Tensor Os, Of;
    if (o.ns_steps_slow() == o.ns_steps_fast()) {
      const at::Tensor O = newton_schulz(inputs[r], ns_config(o, o.ns_steps_slow()));
      Os = O.slice(0, 0, P);
      Of = O.slice(0, P);
    } else {
      Os = newton_schulz(inputs[r].slice(0, 0, P), ns_config(o, o.ns_steps_slow()));
      Of = newton_schulz(inputs[r].slice(0, P), ns_config(o, o.ns_steps_fast()));
    }
    // In fp32, or fp64 with ns_dtype(kDouble) (as the update's norms: update.cpp).
    const at::ScalarType type = at::promote_types(Os.scalar_type(), at::kFloat);
    const at::Tensor Os_wide = Os.to(type);
    const at::Tensor fused =
        slerp_fuse(Os_wide.reshape({-1, n}), Of.to(type).reshape({-1, n}), o.xi(), o.eps())
            .view({P, m, n});
    const at::Tensor delta = (fused - Os_wide).to(at::kFloat);  // apply_rms_update: fp32 delta
    for (int64_t k = 0; k < P; ++k) {
      const Work& w = work[begin + static_cast<size_t>(k)];
      items.push_back({w.param, Os[k], delta[k], w.transposed});
    }
  }
  return ops::apply_rms_update(items, {o.lr(), o.weight_decay(), o.sigma(), o.eps(), device_lr},
                               ok);
}

// The codebook flush (after all parameters of the group have stepped), then re-seeding when
// `reseed_now` (every reseed_every steps).
void flush_and_reseed(GroupMemory& mem, const ProjectedStepResult& r, const FOGOOptions& o,
                      bool reseed_now) {
  ops::codebook_flush(mem.book, {r.m, r.s}, {o.beta_cb(), o.lambda_c(), o.eps(), o.r_dec()});
  if (reseed_now) reseed(mem.book, r.q, r.valid, o.reseed_threshold(), mem.gen);
}

// Mask: the tensors of a group's memory that a step changes, as they were before it, put back
// where ok is false once the step is done.
struct MemoryBefore {
  at::Tensor centroids, S, N, rbar, stats;
};
// On the host before a step: the device counters a Mask step (`ok` defined) updates in place,
// and how consolidate() will know whether it has something new to freeze: on the host, unless
// a step since the last consolidation may be masked; then a device flag, or-ed with each step's
// ok and read at the task boundary.
void prepare_mask_state(GroupMemory& mem, const at::Tensor& ok) {
  if (!ok.defined()) {
    mem.stepped_since_consolidate = at::Tensor();
    return;
  }
  if (!mem.skipped.defined()) mem.skipped = at::zeros({}, ok.options().dtype(at::kLong));
  if (mem.consolidated) mem.stepped_since_consolidate = at::zeros_like(ok);
}
// Before a step's device work: what a Mask step may have to undo. None without `ok`.
std::optional<MemoryBefore> memory_before(GroupMemory& mem, const at::Tensor& ok) {
  if (!ok.defined()) return std::nullopt;
  if (mem.stepped_since_consolidate.defined()) mem.stepped_since_consolidate.logical_or_(ok);
  const auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  return MemoryBefore{copy(mem.book.centroids), copy(mem.book.S), copy(mem.book.N), copy(mem.rbar),
                      copy(mem.stats)};
}
void keep_memory_unless(GroupMemory& mem, const MemoryBefore& before, const at::Tensor& ok) {
  const auto keep = [&](at::Tensor& t, const at::Tensor& was) { t.copy_(at::where(ok, t, was)); };
  keep(mem.book.centroids, before.centroids);
  keep(mem.book.S, before.S);
  keep(mem.book.N, before.N);
  keep(mem.rbar, before.rbar);
  if (before.stats.defined()) keep(mem.stats, before.stats);
  mem.skipped.add_(at::logical_not(ok));
}

// The step's statistics, kept on the device (telemetry() reads them back).
void record_telemetry(GroupMemory& mem, const ProjectedStepResult& r,
                      const std::vector<at::Tensor>& delta_ratios, const FOGOOptions& o) {
  at::Tensor delta_ratio = at::zeros({}, r.dz.options());
  for (const at::Tensor& ratio : delta_ratios) delta_ratio += ratio;
  at::Tensor stats = at::zeros({kNumStats}, r.dz.options());
  stats.slice(0, kGammaSt, kGammaSt + 4).copy_(r.stats);
  stats[kRbar] = mem.rbar;
  stats[kEntropy] = entropy(mem.book.N);
  stats[kLive] = (mem.book.N >= o.reseed_threshold()).sum();
  stats[kDeltaRatio] = delta_ratio / static_cast<double>(delta_ratios.size());
  if (mem.stats.defined()) {
    mem.stats.copy_(stats);
  } else {
    mem.stats = stats;
  }
}

}  // namespace

// What a group's step reads besides its memory and options, prepared on the host: the stages
// (step_stages) decide nothing on the host, so a CUDA graph can capture and replay them.
struct FOGO::StepInputs {
  std::vector<at::Tensor> params, grads;
  at::Tensor ok;    ///< NonFinitePolicy::Mask: 0-d bool on the group's device, else undefined
  at::Tensor keys;  ///< step 7's candidate keys (draw_candidate_keys), or undefined
  bool reseed_now = false;
  at::Tensor lr;  ///< a CUDA graph's learning rate (0-d float64 on the device); else o.lr()
};

void FOGO::step_group(size_t g, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& grads, const at::Tensor& ok) {
  const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
  GroupMemory& mem = impl_->group(g, o);
  const StepInputs in{params,
                      grads,
                      ok,
                      draw_candidate_keys(mem, o, params.front().device()),
                      o.reseed_every() > 0 && (mem.step + 1) % o.reseed_every() == 0,
                      {}};
  prepare_mask_state(mem, ok);
  // A CUDA graph takes the steady-state steps: not the first (it builds the codebook), not a
  // re-seeding one (it reads the queries back), not a sharded one (it exchanges with the ranks).
  const bool graphed = o.cuda_graph() && mem.initialized && !in.reseed_now && !impl_->shard.owns &&
                       !impl_->graphs[g].step.failed();
  if (graphed) {
    graph_step(g, in);
  } else {
    step_stages(g, in);
  }
  ++mem.step;
  mem.consolidated = false;
}

void FOGO::step_stages(size_t g, const StepInputs& in) {
  const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
  GroupMemory& mem = impl_->groups[g];
  const at::Tensor& ok = in.ok;
  std::function<const Projection&(int64_t)> projection;  // fusion_only: none
  if (!o.fusion_only()) {
    projection = [&](int64_t n) -> const Projection& {
      return impl_->projection(o, n, in.params.front().device());
    };
  }
  std::vector<Work> work = working_set(in.params, in.grads, state_, projection);
  if (work.empty()) return;
  // Mask (past the group's first step, so the memory exists): what the step may have to undo.
  const std::optional<MemoryBefore> before = memory_before(mem, ok);
  const ShapeRuns runs =
      detail::sort_into_runs(work, [](const Work& w) { return std::make_pair(w.m, w.n); });
  const StepShard& shard = impl_->shard;
  Share mine = share_of(work, runs, shard);  // all parameters unless sharded
  const std::vector<at::Tensor> inputs = ns_inputs(mine.work, mine.runs, o);
  update_momenta(work, mine, inputs, o, ok);  // 1
  if (o.fusion_only()) {  // 2, 4, 9; the group's memory is never built (initialized stays false)
    share_updates(work, mine, fuse_and_update(mine.work, mine.runs, inputs, o, in.lr, ok), shard);
    return;
  }
  auto [Ps, Pf] = orthogonalize(mine.work, mine.runs, inputs, o);  // 2, 3
  if (mine.sharded) std::tie(Ps, Pf) = share_projections(work, mine, Ps, Pf, o, shard);
  const bool first = !mem.initialized;
  if (first) initialize_memory(mem, Ps, Pf, o);
  const auto [frozen, nu] = long_term_candidates(mem, o, in.keys);
  const ProjectedStepResult r =
      ops::projected_step(Ps, Pf, mem.book.centroids, frozen, nu, mem.rbar,
                          projected_step_params(o, /*filter=*/!first));  // 4-7
  mem.rbar.copy_(r.rbar);
  const std::vector<at::Tensor> ratios = share_updates(
      work, mine, lift_and_update(mine.work, mine.runs, rows_of(r.dz, mine), o, in.lr, ok),
      shard);  // 8, 9
  flush_and_reseed(mem, r, o, in.reseed_now);
  record_telemetry(mem, r, ratios, o);
  if (before) keep_memory_unless(mem, *before, ok);
}

void FOGO::graph_step(size_t g, const StepInputs& in) {
  const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
  GroupMemory& mem = impl_->groups[g];
  auto& graph = impl_->graphs[g];
  // Every tensor the stages read or write besides the static inputs: a replay is valid only while
  // they all stay where the capture found them (in-place updates keep them there; a load, a task
  // boundary or another parameter set moves some).
  std::vector<int64_t> layout = graph.layout(o);
  for (const at::Tensor& p : in.params) {
    detail::GraphedStep::describe(layout, p);
    const auto it = state_.find(p.unsafeGetTensorImpl());
    if (it == state_.end()) continue;
    const auto& st = static_cast<const FOGOParamState&>(*it->second);
    detail::GraphedStep::describe(layout, st.slow_momentum());
    detail::GraphedStep::describe(layout, st.fast_momentum());
  }
  for (const at::Tensor* t :
       {&mem.book.centroids, &mem.book.S, &mem.book.N, &mem.rbar, &mem.stats, &mem.frozen,
        &mem.frozen_nu, &mem.skipped, &mem.stepped_since_consolidate}) {
    detail::GraphedStep::describe(layout, *t);
  }
  const bool ran = graph.step.run(
      std::move(layout), in.grads, {in.ok, in.keys}, o.lr(), in.params.front().device(),
      [&](const detail::GraphedStep::Inputs& s) {
        step_stages(g, {in.params, s.grads, s.tensors[0], s.tensors[1], false, s.lr});
      },
      "FOGO: param group " + std::to_string(g));
  if (!ran) step_stages(g, in);  // the capture failed; nothing ran
}

torch::Tensor FOGO::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Validate everything before changing anything: a bad input leaves the optimizer as it was.
  const detail::GradItems items = detail::collect_grads(
      "FOGO", param_groups_,
      [&](size_t g) { static_cast<const FOGOOptions&>(param_groups_[g].options()).validate(); },
      [&](size_t g, size_t i, const at::Tensor& p) {
        check_matrix(g, i, p, param_groups_[g].params()[0],
                     static_cast<const FOGOOptions&>(param_groups_[g].options()));
        if (const auto it = state_.find(p.unsafeGetTensorImpl()); it != state_.end()) {
          const auto& st = static_cast<const FOGOParamState&>(*it->second);
          detail::check_state_shape("FOGO", g, i, p, st.slow_momentum(), "slow_momentum");
          detail::check_state_shape("FOGO", g, i, p, st.fast_momentum(), "fast_momentum");
        }
      });
  const auto& [params, grads, where] = items;
  const auto policy = [&](size_t g) {
    return static_cast<const FOGOOptions&>(param_groups_[g].options()).nonfinite();
  };
  // Mask groups are checked on the device, except on their first step (the codebook is built
  // from it, and there is no earlier memory to keep): then as Skip.
  const auto masked = [&](size_t g) {
    return policy(g) == NonFinitePolicy::Mask && g < impl_->groups.size() &&
           impl_->groups[g].initialized;
  };
  if (const int64_t bad = detail::first_unusable_item(
          items, [&](size_t g) { return policy(g) != NonFinitePolicy::Unchecked && !masked(g); });
      bad >= 0) {
    const NonFinitePolicy p = policy(where[bad].first);
    if (p == NonFinitePolicy::Skip || p == NonFinitePolicy::Mask) return loss;
    detail::throw_unusable_grad("FOGO", where[bad].first, where[bad].second, params[bad]);
  }
  // Mask: one flag for the step, true when every gradient of the masked groups is usable.
  std::vector<at::Tensor> masked_grads;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (masked(where[k].first)) masked_grads.push_back(grads[k]);
  }
  const at::Tensor ok = detail::grads_usable(masked_grads);
  for (size_t k = 0; k < params.size();) {  // the items come group by group
    const size_t g = where[k].first;
    size_t end = k;
    while (end < params.size() && where[end].first == g) ++end;
    step_group(g, {params.begin() + k, params.begin() + end},
               {grads.begin() + k, grads.begin() + end},
               masked(g) && ok.defined() ? ok.to(params[k].device()) : at::Tensor());
    k = end;
  }
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Task boundaries

void FOGO::consolidate() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < impl_->groups.size() && g < param_groups_.size(); ++g) {
    GroupMemory& mem = impl_->groups[g];
    const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
    if (!mem.initialized || o.freeze_per_task() == 0 || mem.consolidated) continue;
    mem.consolidated = true;
    // Mask: every step since the last consolidation masked (the centroids as they were then): the
    // same centroids would be frozen twice. One read-back, at the task boundary.
    const bool stepped =
        !mem.stepped_since_consolidate.defined() || mem.stepped_since_consolidate.item<bool>();
    mem.stepped_since_consolidate = at::Tensor();
    if (!stepped) continue;
    FrozenPicks picks = select_important(mem.book, mem.start, o.freeze_per_task());
    if (mem.frozen.defined() && mem.frozen.size(0) > 0) {
      mem.frozen = at::cat({mem.frozen, picks.centroids});
      mem.frozen_nu = at::cat({mem.frozen_nu, picks.nu});
    } else {
      mem.frozen = picks.centroids;
      mem.frozen_nu = picks.nu;
    }
  }
}

void FOGO::begin_task() {
  torch::NoGradGuard no_grad;
  for (auto& [key, slot] : state_) {
    auto& st = static_cast<FOGOParamState&>(*slot);
    st.slow_momentum().zero_();
    st.fast_momentum().zero_();
  }
  for (size_t g = 0; g < impl_->groups.size() && g < param_groups_.size(); ++g) {
    GroupMemory& mem = impl_->groups[g];
    if (!mem.initialized) continue;
    const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
    mem.rbar.zero_();
    if (o.reinit_codebook_on_task()) {
      mem.initialized = false;  // re-initialised from the next step's queries
    } else {
      mem.start = mem.book.centroids.clone();
    }
  }
}

void FOGO::set_step_shard(StepShard shard) {
  shard.enabled("FOGO::set_step_shard");
  impl_->shard = std::move(shard);
}

void FOGO::task_boundary() {
  consolidate();
  begin_task();
}

std::vector<FOGOTelemetry> FOGO::telemetry() const {
  std::vector<FOGOTelemetry> out(param_groups_.size());
  // The groups' statistics vectors, stacked per device and read back in one transfer each (one
  // for a model on one device), instead of one synchronisation per group.
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t g = 0; g < impl_->groups.size() && g < out.size(); ++g) {
    const GroupMemory& mem = impl_->groups[g];
    out[g].step = mem.step;
    out[g].frozen = mem.frozen.defined() ? mem.frozen.size(0) : 0;
    if (const auto it = impl_->graphs.find(g); it != impl_->graphs.end()) {
      out[g].graph_captures = it->second.step.captures();
      out[g].graph_replays = it->second.step.replays();
    }
    if (mem.stats.defined()) by_device[mem.stats.device().str()].push_back(g);
  }
  for (const auto& [device, groups] : by_device) {
    std::vector<at::Tensor> stats;  // each group's statistics, then its count of masked steps
    for (const size_t g : groups) {
      const GroupMemory& mem = impl_->groups[g];
      const at::Tensor skipped =
          mem.skipped.defined() ? mem.skipped.reshape({1}) : at::zeros({1}, mem.stats.options());
      stats.push_back(at::cat({mem.stats.to(at::kDouble), skipped.to(at::kDouble)}));
    }
    const at::Tensor host = at::stack(stats).to(at::kCPU).contiguous();
    for (size_t k = 0; k < groups.size(); ++k) {
      const double* v = host.data_ptr<double>() + k * (kNumStats + 1);
      FOGOTelemetry& t = out[groups[k]];
      t.rbar = v[kRbar];
      t.gamma_st = v[kGammaSt];
      t.frac_conflicting = v[kFracConflicting];
      t.frac_over_aligned = v[kFracOverAligned];
      t.frac_lt_protected = v[kFracLtProtected];
      t.codebook_entropy = v[kEntropy];
      t.live_centroids = static_cast<int64_t>(v[kLive]);
      t.delta_ratio = v[kDeltaRatio];
      t.skipped_steps = static_cast<int64_t>(v[kNumStats]);
    }
  }
  return out;
}

FOGO::MemoryView FOGO::memory(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "FOGO::memory: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  if (group >= impl_->groups.size() || !impl_->groups[group].initialized) return {};
  const GroupMemory& mem = impl_->groups[group];
  const auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  return {copy(mem.book.centroids), copy(mem.book.S), copy(mem.book.N), copy(mem.frozen),
          copy(mem.frozen_nu)};
}

}  // namespace fogo

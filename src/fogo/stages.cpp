// The stages of FOGO's step for one param group (fogo_private/fogo/stages.h): the routing of each
// stage over the group's parameters (batched by shape, sharded by owner) to the stage functions of
// projection.h, projected.h, codebook.h and update.h and the one dispatch point ops.h.
#include "fogo_private/fogo/stages.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/projection.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/nonfinite.h"
#include "fogo_private/muon/normuon.h"
#include "fogo_private/ops/ops.h"

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

namespace stages {

// The dtype the group's Newton–Schulz computes in on `device`: ns_dtype, auto resolved.
at::ScalarType compute_dtype(const FOGOOptions& o, const c10::Device& device) {
  return resolve_ns_dtype(o.ns_dtype(), device);
}

const at::Tensor& lift_matrix(const Projection& proj, const FOGOOptions& o) {
  return compute_dtype(o, proj.K.device()) == at::kBFloat16 ? proj.K_bf16 : proj.K;
}

bool fast_stream_takes_gram(const at::Tensor& Bf, const Projection& proj, const FOGOOptions& o) {
  const at::ScalarType dtype = compute_dtype(o, Bf.device());
  const NSForm form = resolve_ns_form(o.ns_form(), o.ns_dtype(), Bf.device());
  const bool full_precision = dtype == at::kFloat || dtype == at::kDouble;
  if (!full_precision && (form == NSForm::Plain || o.ns_gram_restart() == 0)) return false;
  // ns_form Auto decides as Auto decides (timed at the first sight of the shape on the GPU and
  // the CPU); otherwise the cost model.
  if (form == NSForm::Auto) {
    return newton_schulz_projected_auto(Bf, proj.Pi, ns_config(o, o.ns_steps_fast()));
  }
  return newton_schulz_projected_is_cheaper(Bf.size(1), Bf.size(2), o.proj_dim(), o.ns_steps_fast(),
                                            o.ns_gram_restart());
}

void project_rows(const at::Tensor& O, const Projection& proj, at::Tensor& out) {
  const at::Tensor rows = O.reshape({-1, O.size(-1)});
  if (O.scalar_type() == at::kBFloat16 && proj.Pi_bf16.defined()) {
    mm_bf16_f32_out(out, rows, proj.Pi_bf16);
  } else {
    at::mm_out(out, rows.to(at::kFloat), proj.Pi);
  }
}

// Per run of same-shape parameters (m, n) of the working orientation: the slow streams through one
// batched Newton–Schulz chain, the fast streams likewise (both in one chain when K_s == K_f and
// the fast one takes the plain route), and the projections as one GEMM per run and stream. The
// chains' inputs (one [2P, m, n] per run: the slow streams, then the fast ones) were written by
// step 1 in the compute dtype, and O_s stays in that dtype: the update reads it as is.
RunStreams orthogonalize_run(const at::Tensor& input, const Projection* gram,
                             const FOGOOptions& o) {
  const int64_t P = input.size(0) / 2;
  const NSConfig ns_slow = ns_config(o, o.ns_steps_slow()),
                 ns_fast = ns_config(o, o.ns_steps_fast());
  RunStreams out;
  if (!gram && o.ns_steps_slow() == o.ns_steps_fast()) {  // both streams in one chain
    const at::Tensor O = newton_schulz(input, ns_slow);
    out.Os = O.slice(0, 0, P);
    out.Of = O.slice(0, P);
    return out;
  }
  out.Os = newton_schulz(input.slice(0, 0, P), ns_slow);
  const at::Tensor Bf = input.slice(0, P);
  if (gram) {
    out.Pf = newton_schulz_projected(Bf, gram->Pi, ns_fast).reshape({-1, o.proj_dim()});
  } else {
    out.Of = newton_schulz(Bf, ns_fast);
  }
  return out;
}

// Per run, step 2 (orthogonalize_run) and step 3, the projections written straight into their
// rows of Ps and Pf (no cat of the runs).
std::pair<at::Tensor, at::Tensor> orthogonalize_and_project(std::vector<Work>& work,
                                                            const ShapeRuns& runs,
                                                            const std::vector<at::Tensor>& inputs,
                                                            const FOGOOptions& o) {
  if (runs.empty()) return {};  // a shard that owns none of the group
  int64_t R = 0;
  for (const Work& w : work) R += w.m;
  at::Tensor Ps = at::empty({R, o.proj_dim()}, work.front().slow.options());
  at::Tensor Pf = at::empty_like(Ps);
  int64_t row = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [begin, end] = runs[r];
    const int64_t P = static_cast<int64_t>(end - begin), rows = P * work[begin].m;
    const Projection& proj = *work[begin].proj;
    const bool gram = fast_stream_takes_gram(inputs[r].slice(0, P), proj, o);
    const RunStreams O = orthogonalize_run(inputs[r], gram ? &proj : nullptr, o);
    at::Tensor Ps_rows = Ps.slice(0, row, row + rows), Pf_rows = Pf.slice(0, row, row + rows);
    row += rows;
    project_rows(O.Os, proj, Ps_rows);
    if (gram) {
      Pf_rows.copy_(O.Pf);
    } else {
      project_rows(O.Of, proj, Pf_rows);
    }
    for (int64_t k = 0; k < P; ++k) work[begin + k].Os = O.Os[k];
  }
  return {Ps, Pf};
}

Sharing::Sharing(const std::vector<Work>& work, const ShapeRuns& runs, const StepShard& shard)
    : group_(work), shard_(shard) {
  int64_t row = 0;
  for (const Work& w : work) {
    row_.push_back(row);
    row += w.m;
  }
  for (const auto& [begin, end] : runs) {
    const size_t first = mine_.size();
    for (size_t i = begin; i < end; ++i) {
      if (shard.owns && !shard.owns(work[i].whole, work[i].matrix)) continue;
      mine_.push_back(work[i]);
      index_.push_back(i);
    }
    if (mine_.size() > first) runs_.push_back({first, mine_.size()});
  }
}

std::pair<at::Tensor, at::Tensor> Sharing::projections(std::pair<at::Tensor, at::Tensor> mine,
                                                       const FOGOOptions& o) const {
  if (!shard_.owns) return mine;
  const auto& [Ps, Pf] = mine;
  std::vector<ShardUnit> params;
  std::vector<std::vector<at::Tensor>> values;
  for (const Work& w : group_) {
    params.push_back({w.whole, w.matrix});
    const auto buffer = [&] { return at::empty({w.m, o.proj_dim()}, w.slow.options()); };
    values.push_back({buffer(), buffer()});
  }
  int64_t row = 0;
  for (size_t k = 0; k < mine_.size(); ++k) {
    const int64_t m = mine_[k].m;
    values[index_[k]] = {Ps.slice(0, row, row + m), Pf.slice(0, row, row + m)};
    row += m;
  }
  shard_.exchange(params, values);
  std::vector<at::Tensor> all_s, all_f;
  for (const auto& v : values) {
    all_s.push_back(v[0]);
    all_f.push_back(v[1]);
  }
  return {at::cat(all_s), at::cat(all_f)};
}

at::Tensor Sharing::rows(const at::Tensor& dz) const {
  if (!shard_.owns) return dz;
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < mine_.size(); ++k) {
    parts.push_back(dz.slice(0, row_[index_[k]], row_[index_[k]] + mine_[k].m));
  }
  return parts.empty() ? dz.slice(0, 0, 0) : at::cat(parts);
}

std::vector<at::Tensor> Sharing::updates(std::vector<at::Tensor> ratios) const {
  if (!shard_.owns) return ratios;
  std::vector<ShardUnit> params;
  std::vector<at::Tensor> all(group_.size());
  std::vector<std::vector<at::Tensor>> values;
  for (size_t k = 0; k < mine_.size(); ++k) all[index_[k]] = ratios[k];
  for (size_t i = 0; i < group_.size(); ++i) {
    params.push_back({group_[i].whole, group_[i].matrix});
    if (!all[i].defined()) all[i] = at::empty({}, group_[i].param.options().dtype(at::kFloat));
    values.push_back({group_[i].param, all[i]});
    // NorMuon's second moment: only its owner updated it; every rank holds the owner's.
    if (group_[i].v.defined()) values.back().push_back(group_[i].v);
  }
  shard_.exchange(params, values);
  return all;
}

namespace {
at::Tensor entropy(const at::Tensor& N) {
  const at::Tensor p = N / N.sum().clamp_min(1e-30);
  return -(p * at::log(p.clamp_min(1e-30))).sum();
}
}  // namespace

std::vector<Work> working_set(const std::vector<at::Tensor>& params,
                              const std::vector<at::Tensor>& grads, ParamStates& state,
                              const std::function<const Projection&(int64_t n)>& projection,
                              const MatrixLayout& layout, bool normuon, ShapeRuns& runs) {
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
    const MatrixView view = matrix_view(p.sizes(), layout, "FOGO", "a parameter");
    const at::Tensor G = grads[k].to(at::kFloat);
    if (normuon && !st.second_moment().defined())
      st.second_moment(fresh_second_moment(p, layout.batch_dims));
    for (int64_t i = 0; i < view.count(); ++i) {  // each matrix as a parameter of its own
      const int64_t rows = view.rows_of(i), cols = view.cols;
      const auto of = [&](const at::Tensor& t) { return matrix_of(t, view, i); };
      Work w{of(p),
             p,
             i,
             rows > cols,
             std::min(rows, cols),
             std::max(rows, cols),
             of(st.slow_momentum()),
             of(st.fast_momentum()),
             of(G),
             {},
             nullptr,
             normuon ? of(st.second_moment()) : at::Tensor()};
      if (projection) w.proj = &projection(w.n);  // none for fusion_only: Pi is never built
      work.push_back(std::move(w));
    }
  }
  runs = detail::sort_into_runs(work, [](const Work& w) { return std::make_pair(w.m, w.n); });
  return work;
}

void add_second_moments(ParamStates& state, const std::vector<at::Tensor>& params,
                        const MatrixLayout& layout) {
  for (const at::Tensor& p : params) {
    const auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end() || p.numel() == 0) continue;
    auto& st = static_cast<FOGOParamState&>(*it->second);
    if (!st.second_moment().defined()) st.second_moment(fresh_second_moment(p, layout.batch_dims));
  }
}

std::vector<at::Tensor> ns_inputs(const Sharing& share, const FOGOOptions& o) {
  const std::vector<Work>& work = share.work();
  const ShapeRuns& runs = share.runs();
  std::vector<at::Tensor> inputs;
  for (const auto& [begin, end] : runs) {
    inputs.push_back(
        at::empty({2 * static_cast<int64_t>(end - begin), work[begin].m, work[begin].n},
                  work[begin].slow.options().dtype(compute_dtype(o, work[begin].slow.device()))));
  }
  return inputs;
}

void update_momenta(const std::vector<Work>& work, const Sharing& share,
                    const std::vector<at::Tensor>& inputs, const FOGOOptions& o,
                    const at::Tensor& ok) {
  std::vector<MomentaItem> items;
  for (const Work& w : work) items.push_back({w.slow, w.fast, w.G, {}, {}, w.transposed});
  for (size_t r = 0; r < share.runs().size(); ++r) {
    const auto [begin, end] = share.runs()[r];
    const int64_t P = static_cast<int64_t>(end - begin);
    for (size_t j = begin; j < end; ++j) {
      MomentaItem& item = items[share.index()[j]];
      item.Xs = inputs[r][static_cast<int64_t>(j - begin)];
      item.Xf = inputs[r][P + static_cast<int64_t>(j - begin)];
    }
  }
  ops::momenta_step(items, o.mu_s(), o.mu_f(), ok);
}

// A group's first step: the codebook from that step's queries (docs/algorithm.md "First step").
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

// NorMuon (o.normuon()): each item's Ohat = O_s + delta normalized row by row of its parameter's
// matrix view (normuon_row_factors, updating the second moments `work[k].v`), given to the update
// as D O_s and D delta: the RMS update then steps along the normalized Ohat (whose Frobenius norm
// is Ohat's, so gamma_t is unchanged), and the telemetry ratio is |D delta| / |D O_s|. Under Mask
// the second moments keep their bits where `ok` is false.
void normuon_items(std::vector<RmsUpdateItem>& items, const std::vector<const Work*>& work,
                   const FOGOOptions& o, const at::Tensor& ok) {
  if (!o.normuon()) return;
  std::vector<at::Tensor> moments;
  for (const Work* w : work) moments.push_back(w->v);
  const detail::MaskScope keep(ok, moments);
  for (size_t k = 0; k < items.size(); ++k) {
    RmsUpdateItem& item = items[k];
    const at::Tensor& v = work[k]->v;
    const at::Tensor Os = item.Os.to(v.scalar_type()), delta = item.delta.to(v.scalar_type());
    const at::Tensor Ohat = Os + delta;  // [m, n], the view's transpose when transposed
    const at::Tensor D = normuon_row_factors(item.transposed ? Ohat.t() : Ohat, v,
                                             o.normuon_beta2(), o.normuon_eps());
    const at::Tensor rows = item.transposed ? D.unsqueeze(0) : D.unsqueeze(1);
    item.Os = Os * rows;
    item.delta = (delta * rows).to(at::kFloat);  // apply_rms_update: fp32 delta
  }
  keep.restore();
}

// Step 8, the proximal lift of dz = zbar - Ps (one GEMM per shape run, at the NS precision:
// bf16 products when the NS computes in bf16), and step 9, the RMS-scaled update with decoupled
// decay, with the step's learning rate (a CUDA graph's on the device), all parameters in one call
// (one set of launches per group on CUDA). Returns |delta|_F / |O_s|_F of each parameter, in
// `work` order. With `ok` (Mask), a parameter keeps its value where ok is false.
std::vector<at::Tensor> lift_and_update(const std::vector<Work>& work, const ShapeRuns& runs,
                                        const at::Tensor& dz, const FOGOOptions& o,
                                        const LearningRate& lr, const at::Tensor& ok) {
  std::vector<RmsUpdateItem> items;
  std::vector<const Work*> order;  // each item's Work
  int64_t row = 0;
  for (const auto& [begin, end] : runs) {
    const int64_t m = work[begin].m, n = work[begin].n;
    const int64_t rows = m * static_cast<int64_t>(end - begin);
    const Projection& proj = *work[begin].proj;
    const at::Tensor delta =
        proximal_lift(dz.slice(0, row, row + rows), lift_matrix(proj, o)).view({-1, m, n});
    row += rows;
    for (size_t i = begin; i < end; ++i) {
      items.push_back(
          {work[i].param, work[i].Os, delta[static_cast<int64_t>(i - begin)], work[i].transposed});
      order.push_back(&work[i]);
    }
  }
  normuon_items(items, order, o, ok);
  return ops::apply_rms_update(items, {lr, o.weight_decay(), o.sigma(), o.eps()}, ok);
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
                                        const LearningRate& lr, const at::Tensor& ok) {
  std::vector<RmsUpdateItem> items;
  std::vector<const Work*> order;  // each item's Work
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [begin, end] = runs[r];
    const int64_t P = static_cast<int64_t>(end - begin);
    const int64_t m = work[begin].m, n = work[begin].n;
    const RunStreams O = orthogonalize_run(inputs[r], /*gram=*/nullptr, o);
    const at::Tensor &Os = O.Os, &Of = O.Of;
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
      order.push_back(&w);
    }
  }
  normuon_items(items, order, o, ok);
  return ops::apply_rms_update(items, {lr, o.weight_decay(), o.sigma(), o.eps()}, ok);
}

// The codebook flush (after all parameters of the group have stepped), then re-seeding when
// `reseed_now` (every reseed_every steps).
void flush_and_reseed(GroupMemory& mem, const ProjectedStepResult& r, const FOGOOptions& o,
                      bool reseed_now) {
  ops::codebook_flush(mem.book, {r.m, r.s}, {o.beta_cb(), o.lambda_c(), o.eps(), o.r_dec()});
  if (reseed_now) reseed(mem.book, r.q, r.valid, o.reseed_threshold(), mem.gen);
}

void prepare_mask_state(GroupMemory& mem, const at::Tensor& ok) {
  // On the host, unless a step since the last consolidation may be masked: then a device flag,
  // or-ed with each step's ok and read at the task boundary.
  if (!ok.defined()) {
    mem.stepped_since_consolidate = at::Tensor();
    return;
  }
  if (!mem.skipped.defined()) mem.skipped = at::zeros({}, ok.options().dtype(at::kLong));
  if (mem.consolidated) mem.stepped_since_consolidate = at::zeros_like(ok);
}

namespace {
std::vector<at::Tensor> masked_tensors(GroupMemory& mem) {
  std::vector<at::Tensor> out;
  mem.visit([&](const char*, at::Tensor& t, unsigned use) {
    if (use & GroupMemory::kMasked) out.push_back(t);
  });
  return out;
}
}  // namespace

MaskedMemory::MaskedMemory(GroupMemory& mem, const at::Tensor& ok)
    : mem_(mem),
      ok_(ok),
      keep_(ok, ok.defined() ? masked_tensors(mem) : std::vector<at::Tensor>{}) {
  if (ok.defined() && mem.stepped_since_consolidate.defined()) {
    mem.stepped_since_consolidate.logical_or_(ok);
  }
}

void MaskedMemory::restore() const {
  if (!ok_.defined()) return;
  keep_.restore(masked_tensors(mem_));  // the flush may have replaced a tensor
  mem_.skipped.add_(at::logical_not(ok_));
}

// The step's statistics, kept on the device (telemetry() reads them back).
void record_telemetry(GroupMemory& mem, const ProjectedStepResult& r,
                      const std::vector<at::Tensor>& delta_ratios, const FOGOOptions& o) {
  at::Tensor delta_ratio = at::zeros({}, r.dz.options());
  for (const at::Tensor& ratio : delta_ratios) delta_ratio += ratio;
  at::Tensor stats = at::zeros({kNumStats}, r.dz.options());
  // The projected step's four fractions, in its order (projected.h).
  static_assert(stat::frac_lt_protected - stat::gamma_st == 3, "FOGO_TELEMETRY's order");
  stats.slice(0, stat::gamma_st, stat::frac_lt_protected + 1).copy_(r.stats);
  stats[stat::rbar] = mem.rbar;
  stats[stat::codebook_entropy] = entropy(mem.book.N);
  stats[stat::live_centroids] = (mem.book.N >= o.reseed_threshold()).sum();
  stats[stat::delta_ratio] = delta_ratio / static_cast<double>(delta_ratios.size());
  if (mem.stats.defined()) {
    mem.stats.copy_(stats);
  } else {
    mem.stats = stats;
  }
}

}  // namespace stages
}  // namespace fogo

// fogo::FOGO: the step of docs/algorithm.md per param group (device_step, in its order), the task
// boundaries, telemetry and the state. The stages' routing over a group's parameters is in
// stages.cpp, the stage functions in projection.h (Pi, lift), projected.h (slerp, filters),
// codebook.h (memory) and update.h, dispatched by ops.h; checkpoints in checkpoint.cpp.
#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "fogo/fogo_optimizer.h"
#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/stages.h"
#include "fogo_private/fogo/state.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/ops/ops.h"

namespace fogo {
// ---------------------------------------------------------------------------------------------
// Param state

void FOGOParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(slow_momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fast_momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(second_moment);  // only where defined (NorMuon's)
}

void FOGOParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, slow_momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, fast_momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, second_moment);
}

bool operator==(const FOGOParamState& a, const FOGOParamState& b) {
  const auto same = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
  };
  return same(a.slow_momentum(), b.slow_momentum()) && same(a.fast_momentum(), b.fast_momentum()) &&
         same(a.second_moment(), b.second_moment());
}

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
  matrix_view(p.sizes(), matrix_layout(o), "FOGO", detail::describe_param(group, index, p));
}

}  // namespace

FOGO::FOGO(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, FOGOOptions defaults)
    : MatrixOptimizerOf(param_groups, defaults), impl_(std::make_unique<Impl>()) {
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
// The step (MatrixOptimizer's frame around step_group)

bool FOGO::maskable(size_t g) const {
  return g < impl_->groups.size() && impl_->groups[g].initialized;
}

void FOGO::check_param(size_t g, size_t i, const at::Tensor& p) const {
  check_matrix(g, i, p, param_groups_[g].params()[0], options(g));
  if (const auto it = state_.find(p.unsafeGetTensorImpl()); it != state_.end()) {
    const auto& st = static_cast<const FOGOParamState&>(*it->second);
    detail::check_state_shape("FOGO", g, i, p, st.slow_momentum(), "slow_momentum");
    detail::check_state_shape("FOGO", g, i, p, st.fast_momentum(), "fast_momentum");
  }
}

bool FOGO::reseeds_now(size_t g) const {
  const auto& o = options(g);
  return o.reseed_every() > 0 && (impl_->groups[g].step + 1) % o.reseed_every() == 0;
}

void FOGO::create_state(const GroupStep& s) {
  const auto& o = options(s.group);
  stages::prepare_mask_state(impl_->group(s.group, o), s.ok);
  // NorMuon's second moments exist before a CUDA graph's layout is taken (normuon turned on
  // between steps, a checkpoint without them): working_set makes those of new states.
  if (o.normuon()) stages::add_second_moments(state_, s.params, matrix_layout(o));
}

// What the step reads besides its memory and options, prepared on the host: the stages
// (device_step) decide nothing on the host, so a CUDA graph can capture and replay them. A graph
// takes the steady-state steps: not the first (it builds the codebook), not a re-seeding one (it
// reads the queries back); the frame never graphs a sharded one (it exchanges with the ranks).
FOGO::HostStep FOGO::prepare_step(const GroupStep& s) {
  GroupMemory& mem = impl_->groups[s.group];
  const at::Tensor keys =
      stages::draw_candidate_keys(mem, options(s.group), s.params.front().device());
  return {{keys}, mem.initialized && !reseeds_now(s.group)};
}

std::vector<at::Tensor> FOGO::masked_tensors(const StepInputs& in) const {
  (void)in;
  return {};
}

std::vector<at::Tensor> FOGO::touched(const GroupStep& s) const {
  std::vector<at::Tensor> touched = s.params;
  for (const at::Tensor& p : s.params) {
    const auto it = state_.find(p.unsafeGetTensorImpl());
    if (it == state_.end()) continue;
    const auto& st = static_cast<const FOGOParamState&>(*it->second);
    touched.push_back(st.slow_momentum());
    touched.push_back(st.fast_momentum());
    if (st.second_moment().defined()) touched.push_back(st.second_moment());
  }
  impl_->groups[s.group].visit([&](const char*, const at::Tensor& t, unsigned use) {
    if (use & GroupMemory::kStep) touched.push_back(t);
  });
  return touched;
}

std::function<void()> FOGO::save_host_state(const GroupStep& s) {
  const size_t g = s.group;
  auto states = std::make_shared<detail::SavedStates>(*this, s.params);
  auto memory = std::make_shared<GroupMemory>(impl_->groups[g]);
  memory->gen = impl_->groups[g].gen.clone();
  auto projections = std::make_shared<decltype(impl_->projections)>(impl_->projections);
  return [this, g, states, memory, projections] {
    states->restore();
    impl_->groups[g] = *memory;
    impl_->projections = *projections;
  };
}

void FOGO::finish_group(const GroupStep& s) {
  GroupMemory& mem = impl_->groups[s.group];
  ++mem.step;
  mem.consolidated = false;
}

// Steps 1-9 and the flush, as docs/algorithm.md lists them; sharding is the exchange hook `share`
// (the identity unsharded), Mask the scope around the memory.
void FOGO::device_step(const StepInputs& in) {
  using namespace stages;
  const size_t g = in.group;
  const auto& o = options(g);
  const at::Tensor& keys = in.extra[0];  // prepare_step's
  GroupMemory& mem = impl_->groups[g];
  std::function<const Projection&(int64_t)> projection;  // fusion_only: none, Pi is never built
  if (!o.fusion_only()) {
    projection = [&](int64_t n) -> const Projection& {
      return impl_->projection(o, n, in.params.front().device());
    };
  }
  ShapeRuns runs;
  std::vector<Work> work =
      working_set(in.params, in.grads, state_, projection, matrix_layout(o), o.normuon(), runs);
  if (work.empty()) return;
  const MaskedMemory masked(mem, in.ok);
  Sharing share(work, runs, step_shard());  // this rank's parameters
  const std::vector<at::Tensor> inputs = ns_inputs(share, o);
  update_momenta(work, share, inputs, o, in.ok);  // 1 momenta
  if (o.fusion_only()) {  // 2, 4, 9 in parameter space; no memory is built or read
    share.updates(fuse_and_update(share.work(), share.runs(), inputs, o, in.lr, in.ok));
    return masked.restore();
  }
  const auto [Ps, Pf] = share.projections(  // 2 orthogonalize, 3 project
      orthogonalize_and_project(share.work(), share.runs(), inputs, o), o);
  const bool first = !mem.initialized;
  if (first) initialize_memory(mem, Ps, Pf, o);  // the codebook, from the first step's queries
  const auto [frozen, nu] = long_term_candidates(mem, o, keys);  // A_t of step 7
  const ProjectedStepResult r =  // 4 slerp, 5 memory read, 6 short-term, 7 long-term
      ops::projected_step(Ps, Pf, mem.book.centroids, frozen, nu, mem.rbar,
                          projected_step_params(o, /*filter=*/!first));
  mem.rbar.copy_(r.rbar);
  const std::vector<at::Tensor> ratios = share.updates(  // 8 lift, 9 update
      lift_and_update(share.work(), share.runs(), share.rows(r.dz), o, in.lr, in.ok));
  flush_and_reseed(mem, r, o, reseeds_now(g));  // the codebook flush
  record_telemetry(mem, r, ratios, o);
  masked.restore();
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

MatrixView FOGO::matrix_view(size_t group, const at::Tensor& param) const {
  std::ostringstream what;
  what << "a parameter of group " << group << " (shape " << param.sizes() << ")";
  return fogo::matrix_view(param.sizes(), matrix_layout(options(group)), "FOGO", what.str());
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
    const GraphStats graphed = graph_stats(g);
    out[g].graph_captures = graphed.captures;
    out[g].graph_replays = graphed.replays;
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
#define FOGO_UNPACK_STAT(T, name, source, ...) \
  FOGO_TELEMETRY_IF_##source(t.name = static_cast<T>(v[stat::name]);)
      FOGO_TELEMETRY(FOGO_UNPACK_STAT)
#undef FOGO_UNPACK_STAT
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

// The step frame of fogo's matrix optimizers (matrix_optimizer.h).
#include "fogo/matrix_optimizer.h"

#include <ATen/ATen.h>
#include <fogo/param_groups.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/closure.h"
#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/frame/nonfinite.h"

namespace fogo {

MatrixOptimizer::MatrixOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, std::move(defaults)) {
  // Not through add_param_group: name() is not callable while the derived class is constructed.
  for (const auto& group : param_groups) detail::add_param_group_as_given(*this, group);
  exact_groups_ = param_groups_.size();
}

void MatrixOptimizer::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  // A group added around this one is refused before the new one is counted as exact.
  detail::check_groups_added_exactly(name(), param_groups_, exact_groups_);
  detail::add_param_group_as_given(*this, group);
  exact_groups_ = param_groups_.size();
}

torch::Tensor MatrixOptimizer::step(LossClosure closure) { return step_with({}, closure); }

MatrixView MatrixOptimizer::matrix_view(size_t group, const at::Tensor& param) const {
  (void)group;
  return fogo::matrix_view(param.sizes(), {}, name(), "a parameter");
}

torch::Tensor MatrixOptimizer::step_with(const StepContext& context, LossClosure closure) {
  torch::NoGradGuard no_grad;
  const torch::Tensor loss = detail::run_closure(closure);
  // 1. Validate everything before changing anything: first that every group has its own options.
  detail::check_groups_added_exactly(name(), param_groups_, exact_groups_);
  const detail::GradItems items = detail::collect_grads(
      name(), param_groups_, [&](size_t g) { check_group(g); },
      [&](size_t g, size_t i, const at::Tensor& p) {
        check_param(g, i, p);
        check_frame_param(g, i, p);
      },
      [&](size_t g) { return weight_decay(g); });
  const auto& [params, grads, where] = items;
  // 2. The policy: the caller's decision, or this optimizer's over its own gradients.
  bool can_mask = true;
  for (const auto& [g, i] : where) can_mask = can_mask && maskable(g);
  NonFiniteDecision decision;
  if (context.decided) {
    decision = *context.decided;
    TORCH_CHECK(decision.kind == NonFiniteDecision::Kind::Step ||
                    (decision.kind == NonFiniteDecision::Kind::Mask && decision.ok.defined()),
                name(), "::step_with: a caller's decision must be Step, or Mask with its flag");
    TORCH_CHECK(decision.kind != NonFiniteDecision::Kind::Mask || can_mask, name(),
                "::step_with: the caller decided Mask for a step that cannot be masked (a group's "
                "first step; maskable(g) is false)");
  } else {
    std::vector<NonFinitePolicy> policies;
    policies.reserve(where.size());
    for (const auto& [g, i] : where) policies.push_back(nonfinite(g));
    decision = decide_nonfinite(policies, detail::usable_flags(policies, grads), can_mask);
  }
  if (decision.kind == NonFiniteDecision::Kind::Raise) {
    const auto [g, i] = where[decision.item];
    detail::throw_unusable_grad(name(), detail::describe_param(g, i, params[decision.item]),
                                grads[decision.item]);
  }
  if (decision.kind == NonFiniteDecision::Kind::Skip) return loss;
  // 3. Each group with gradients (the items come group by group), masked by the step's flag.
  std::vector<GroupStep> steps;
  for (size_t k = 0; k < params.size(); ++k) {
    if (steps.empty() || steps.back().group != where[k].first) {
      GroupStep s;
      s.group = where[k].first;
      if (decision.kind == NonFiniteDecision::Kind::Mask) s.ok = decision.ok.to(params[k].device());
      steps.push_back(std::move(s));
    }
    steps.back().params.push_back(params[k]);
    steps.back().grads.push_back(grads[k]);
  }
  for (const GroupStep& s : steps) step_group(s);
  // 4.
  finish_step(steps);
  return loss;
}

}  // namespace fogo

// ---------------------------------------------------------------------------------------------
// GroupFrame: one group's step, written once.

namespace fogo {

struct GroupFrame::Graphs {
  std::map<size_t, detail::GroupGraph> groups;  // cuda_graph: each group's captured step
};

GroupFrame::GroupFrame(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                       std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : MatrixOptimizer(param_groups, std::move(defaults)), graphs_(std::make_unique<Graphs>()) {}

GroupFrame::~GroupFrame() = default;
GroupFrame::GroupFrame(GroupFrame&&) noexcept = default;
GroupFrame& GroupFrame::operator=(GroupFrame&&) noexcept = default;

void GroupFrame::set_step_shard(StepShard shard) {
  shard.enabled((std::string(name()) + "::set_step_shard").c_str());
  shard_ = std::move(shard);
}

void GroupFrame::set_lr_dtype(size_t group, at::ScalarType dtype) {
  TORCH_CHECK(group < param_groups_.size(), name(), "::set_lr_dtype: group ", group,
              " does not exist (", param_groups_.size(), " groups)");
  if (lr_dtypes_.size() <= group) lr_dtypes_.resize(group + 1, at::kDouble);
  lr_dtypes_[group] = dtype;
}

GroupFrame::GraphStats GroupFrame::graph_stats(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), name(), "::graph_stats: group ", group,
              " does not exist (", param_groups_.size(), " groups)");
  const auto it = graphs_->groups.find(group);
  if (it == graphs_->groups.end()) return {};
  return {it->second.step.captures(), it->second.step.replays()};
}

std::vector<at::Tensor> GroupFrame::shard_values(size_t g, const at::Tensor& param,
                                                 const MatrixView& view, int64_t k) const {
  (void)g, (void)param, (void)view, (void)k;
  return {};
}

void GroupFrame::finish_step(const std::vector<GroupStep>& groups) {
  if (!shard_.enabled(name())) return;
  std::vector<ShardUnit> units;
  std::vector<std::vector<at::Tensor>> values;
  for (const GroupStep& s : groups) {
    for (const at::Tensor& p : s.params) {
      const MatrixView view = matrix_view(s.group, p);
      for (int64_t k = 0; k < view.count(); ++k) {
        units.push_back({p, k});
        values.push_back({matrix_of(p, view, k)});
        for (at::Tensor& t : shard_values(s.group, p, view, k)) values.back().push_back(t);
      }
    }
  }
  shard_.exchange(units, values);
}

void GroupFrame::check_frame_param(size_t g, size_t i, const at::Tensor& p) const {
  if (cuda_graph(g)) detail::check_graph_device(name(), g, i, p);
}

std::vector<at::Tensor> GroupFrame::masked_tensors(const StepInputs& in) const {
  return touched(GroupStep{in.group, in.params, in.grads, in.ok});
}

std::function<void()> GroupFrame::save_host_state(const GroupStep& s) {
  auto states = std::make_shared<detail::SavedStates>(*this, s.params);
  return [states] { states->restore(); };
}

void GroupFrame::run_device_step(const StepInputs& in) {
  // Mask: what the step changes besides the parameters, put back where the flag is false.
  const detail::MaskScope keep(in.ok,
                               in.ok.defined() ? masked_tensors(in) : std::vector<at::Tensor>{});
  device_step(in);
  keep.restore();
}

void GroupFrame::step_group(const GroupStep& s) {
  create_state(s);
  HostStep host = prepare_step(s);
  const size_t g = s.group;
  const at::ScalarType dtype = g < lr_dtypes_.size() ? lr_dtypes_[g] : at::kDouble;
  const StepInputs in{g,
                      s.params,
                      s.grads,
                      s.ok,
                      {param_groups_[g].options().get_lr(), dtype},
                      std::move(host.extra)};
  const auto work = [this](const StepInputs& inputs) { run_device_step(inputs); };
  detail::GroupGraph& graph = graphs_->groups[g];
  // A sharded step exchanges with the ranks: never from a graph.
  if (cuda_graph(g) && host.graphable && !shard_.enabled(name()) && !graph.step.failed()) {
    std::vector<int64_t> layout{
        graph.epoch(param_groups_[g].options(),
                    [this](const auto& a, const auto& b) { return same_except_lr(a, b); })};
    for (const at::Tensor& t : touched(s)) detail::GraphedStep::describe(layout, t);
    const auto save = [&] { return save_host_state(s); };
    if (graph.step.run(std::move(layout), in, s.params.front().device(), work,
                       std::string(name()) + ": param group " + std::to_string(g), save)) {
      return finish_group(s);
    }
  }
  work(in);
  finish_group(s);
}

}  // namespace fogo

// The step frame of fogo's matrix optimizers (matrix_optimizer.h).
#include "fogo/matrix_optimizer.h"

#include <ATen/ATen.h>
#include <fogo/param_groups.h>

#include "fogo_private/frame/checks.h"
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
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // 1. Validate everything before changing anything: first that every group has its own options.
  detail::check_groups_added_exactly(name(), param_groups_, exact_groups_);
  const detail::GradItems items = detail::collect_grads(
      name(), param_groups_, [&](size_t g) { check_group(g); },
      [&](size_t g, size_t i, const at::Tensor& p) { check_param(g, i, p); },
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

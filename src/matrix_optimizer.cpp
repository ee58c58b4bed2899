// The step frame of fogo's matrix optimizers (matrix_optimizer.h).
#include "fogo/matrix_optimizer.h"

#include <ATen/ATen.h>

#include "fogo/detail/checks.h"

namespace fogo {

torch::Tensor MatrixOptimizer::step(LossClosure closure) { return step_with({}, closure); }

torch::Tensor MatrixOptimizer::step_with(const StepContext& context, LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // 1. Validate everything before changing anything.
  const detail::GradItems items = detail::collect_grads(
      name(), param_groups_, [&](size_t g) { check_group(g); },
      [&](size_t g, size_t i, const at::Tensor& p) { check_param(g, i, p); });
  const auto& [params, grads, where] = items;
  // 2. The policy: Raise and Skip groups on the host, one read for the step, unless the caller
  // has read them already.
  const auto policy = [&](size_t k) { return policy_now(where[k].first); };
  if (!context.grads_checked) {
    const int64_t bad = detail::first_unusable_item(items, [&](size_t g) {
      return policy_now(g) == NonFinitePolicy::Raise || policy_now(g) == NonFinitePolicy::Skip;
    });
    if (bad >= 0) {
      if (policy(bad) == NonFinitePolicy::Skip) return loss;
      detail::throw_unusable_grad(name(), where[bad].first, where[bad].second, params[bad]);
    }
  }
  // Mask groups: one flag for the step on the device, true when every gradient of the Mask groups
  // is usable (the caller's flag when it gives one).
  std::vector<at::Tensor> masked;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (policy(k) == NonFinitePolicy::Mask) masked.push_back(grads[k]);
  }
  at::Tensor ok;
  if (!context.grads_checked && !masked.empty()) {
    ok = context.ok.defined() ? context.ok : detail::grads_usable(masked);
  }
  // 3. Each group with gradients (the items come group by group).
  std::vector<GroupStep> steps;
  for (size_t k = 0; k < params.size(); ++k) {
    if (steps.empty() || steps.back().group != where[k].first) {
      GroupStep s;
      s.group = where[k].first;
      if (ok.defined() && policy(k) == NonFinitePolicy::Mask) s.ok = ok.to(params[k].device());
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

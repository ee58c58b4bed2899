#pragma once
// Input validation and checkpoint helpers shared by fogo's optimizers. Every error names the
// optimizer, the option or parameter (group g, index i, shape) and what is wrong with it.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <string>
#include <vector>

namespace fogo::detail {

/// Throws unless `value` is finite and inside [lo, hi] (inclusive ends).
void check_range(const char* optimizer, const char* option, double value, double lo, double hi);

/// "parameter i of group g (shape [..])", for messages.
std::string describe_param(size_t group, size_t index, const at::Tensor& param);

/// Rejects gradients fogo's matrix optimizers cannot handle: complex or sparse tensors.
void check_grad_kind(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                     const at::Tensor& grad);

/// The parameters of an optimizer that have gradients, in group order, with (group, index).
struct GradItems {
  std::vector<at::Tensor> params, grads;
  std::vector<std::pair<size_t, size_t>> where;
};

/// Collects the parameters with gradients after validating everything, before anything changes:
/// `check_group(g)` for each group (its options), `check_param(g, i, param)` for each parameter
/// with a gradient, and check_grad_kind on its gradient.
GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param);

/// Index of the first tensor holding a NaN or an infinity, or -1: one host synchronisation for
/// the whole list.
int64_t first_nonfinite(const std::vector<at::Tensor>& tensors);

/// The error for a non-finite gradient of `param` (parameter `index` of group `group`).
[[noreturn]] void throw_nonfinite(const char* optimizer, size_t group, size_t index,
                                  const at::Tensor& param);

/// Loads with LibTorch's optimizer serialisation, then runs `validate(group, index, param)` on
/// every parameter that received state. If loading or validation throws, the optimizer's previous
/// state and options are restored before the error propagates: a bad checkpoint loses nothing.
void load_transactional(torch::optim::Optimizer& optimizer, const std::function<void()>& load,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& validate);

}  // namespace fogo::detail

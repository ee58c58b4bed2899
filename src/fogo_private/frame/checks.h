#pragma once
// Input validation shared by fogo's optimizers: options, parameters, gradients' kinds and the
// step's scalars, all before anything changes. Every error names the optimizer, the option or
// parameter (group g, index i, shape) and what is wrong with it. (The non-finite policy is in
// nonfinite.h, checkpoint integrity in integrity.h.)

#include <torch/optim/optimizer.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fogo::detail {

/// Throws unless `value` is finite and inside [lo, hi] (inclusive ends).
void check_range(const char* optimizer, const char* option, double value, double lo, double hi);

/// "parameter i of group g (shape [..])", for messages.
std::string describe_param(size_t group, size_t index, const at::Tensor& param);

/// For an optimizer option cuda_graph(true): throws unless `param` is on a CUDA device (and fogo
/// was built with CUDA), naming the option and the parameter.
void check_graph_device(const char* optimizer, size_t group, size_t index, const at::Tensor& param);

/// Rejects gradients fogo's matrix optimizers cannot handle: complex or sparse tensors.
void check_grad_kind(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                     const at::Tensor& grad);

/// The parameters of an optimizer that have gradients, in group order, with (group, index).
struct GradItems {
  std::vector<at::Tensor> params, grads;
  std::vector<std::pair<size_t, size_t>> where;
};

/// Collects the parameters with gradients after validating everything, before anything changes:
/// `check_group(g)` for each group (its options), that no parameter is listed twice (in one group
/// or two), `check_param(g, i, param)` for each parameter with a gradient, check_grad_kind on its
/// gradient, and the step's scalars: the group's lr representable in the parameter's dtype, and
/// lr x `weight_decay(g)` (the group's decoupled decay, 0 for none) at most 1.
GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param,
                        const std::function<double(size_t)>& weight_decay);

/// The state `what` made for parameter `p` (group g, index i) at an earlier step still has its
/// shape: a parameter resized since (model surgery, a reallocation) is refused naming it and
/// both shapes, before anything changes (the step would otherwise fail half-way in ATen).
void check_state_shape(const char* optimizer, size_t g, size_t i, const at::Tensor& p,
                       const at::Tensor& state, const char* what);

}  // namespace fogo::detail

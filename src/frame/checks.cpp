// Input validation (fogo_private/frame/checks.h): every error names what is wrong, before anything
// changes.
#include "fogo_private/frame/checks.h"

#include <ATen/ATen.h>
#include <c10/util/flat_hash_map.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace fogo::detail {

void check_range(const char* optimizer, const char* option, double value, double lo, double hi) {
  TORCH_CHECK(std::isfinite(value) && value >= lo && value <= hi, optimizer, ": option '", option,
              "' must be finite and in [", lo, ", ", hi, "], got ", value);
}

std::string describe_param(size_t group, size_t index, const at::Tensor& param) {
  std::ostringstream out;
  out << "parameter " << index << " of group " << group << " (shape " << param.sizes() << ")";
  return out.str();
}

void check_grad_kind(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                     const at::Tensor& grad) {
  TORCH_CHECK(
      !param.is_complex() && !grad.is_complex(), optimizer,
      " does not support complex parameters or gradients: ", describe_param(group, index, param));
  TORCH_CHECK(!grad.is_sparse(), optimizer,
              " does not support sparse gradients: ", describe_param(group, index, param));
  TORCH_CHECK(grad.sizes() == param.sizes(), optimizer, ": gradient of ",
              describe_param(group, index, param), " has shape ", grad.sizes());
}

namespace {

// The largest finite value of a parameter's dtype.
double largest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::max());
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
    case at::kFloat:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

// The step's scalars must be representable in the parameter's dtype, where the update multiplies
// by them: lr 1e39 is Inf in float32 (ATen refuses it half-way through a step, naming nothing),
// and the decay factor 1 - lr x weight_decay flips the parameters' sign and grows them (Inf
// within a few steps, silently) once lr x weight_decay exceeds 1.
void check_step_scalars(const char* optimizer, size_t group, size_t index, const at::Tensor& param,
                        const torch::optim::OptimizerOptions& options, double wd) {
  double lr = 0;
  try {
    lr = options.get_lr();
  } catch (const c10::Error&) {
    return;  // options without a learning rate: nothing to check
  }
  const double max = largest(param.scalar_type());
  TORCH_CHECK(std::abs(lr) <= max, optimizer, ": option 'lr' of param group ", group, " is ", lr,
              ", beyond the largest ", param.scalar_type(), " (", max, "), the dtype of ",
              describe_param(group, index, param), "; the step was not applied");
  TORCH_CHECK(lr * wd <= 1.0, optimizer, ": options 'lr' x 'weight_decay' of param group ", group,
              " is ", lr, " x ", wd, " = ", lr * wd,
              " > 1: the decay factor 1 - lr x weight_decay would flip the sign of ",
              describe_param(group, index, param),
              " and grow it without bound (Inf within a few steps); the step was not applied");
}

}  // namespace

GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param,
                        const std::function<double(size_t)>& weight_decay) {
  // Python's torch.optim refuses a parameter listed twice at construction; LibTorch's
  // add_param_group only notices one that already has state, which fogo creates lazily. Stepped
  // once per listing through one shared state, it would silently move twice as far.
  ska::flat_hash_map<const c10::TensorImpl*, std::pair<size_t, size_t>> seen;
  GradItems items;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group(g);
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      const auto [first, inserted] = seen.emplace(p.unsafeGetTensorImpl(), std::make_pair(g, i));
      TORCH_CHECK(inserted, optimizer, ": ", describe_param(g, i, p), " is also ",
                  describe_param(first->second.first, first->second.second, p),
                  ": a parameter may not appear in more than one parameter group (or twice in "
                  "one)");
      if (!p.grad().defined()) continue;
      check_param(g, i, p);
      check_grad_kind(optimizer, g, i, p, p.grad());
      check_step_scalars(optimizer, g, i, p, groups[g].options(), weight_decay(g));
      items.params.push_back(p);
      items.grads.push_back(p.grad());
      items.where.emplace_back(g, i);
    }
  }
  return items;
}

void check_graph_device(const char* optimizer, size_t group, size_t index,
                        const at::Tensor& param) {
#ifdef FOGO_WITH_CUDA
  TORCH_CHECK(param.is_cuda(), optimizer,
              ": option 'cuda_graph' captures the step on a CUDA device, but ",
              describe_param(group, index, param), " is on ", param.device(),
              "; set cuda_graph(false) for this param group");
#else
  (void)param, (void)index;
  TORCH_CHECK(false, optimizer, ": option 'cuda_graph' needs fogo built with CUDA ",
              "(FOGO_WITH_CUDA); param group ", group, " sets it");
#endif
}

void check_state_shape(const char* optimizer, size_t g, size_t i, const at::Tensor& p,
                       const at::Tensor& state, const char* what) {
  if (!state.defined()) return;
  TORCH_CHECK(state.sizes() == p.sizes(), optimizer, ": ", describe_param(g, i, p), " has shape ",
              p.sizes(), " but its ", what, " from earlier steps has shape ", state.sizes(),
              ": the parameter was resized; give the optimizer its new parameters (a new "
              "optimizer, or a load of a checkpoint for them). Nothing was changed");
}

}  // namespace fogo::detail

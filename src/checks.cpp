#include "fogo/detail/checks.h"

#include <ATen/ATen.h>

#include <cmath>
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
  TORCH_CHECK(!param.is_complex() && !grad.is_complex(), optimizer,
              " does not support complex tensors: ", describe_param(group, index, param));
  TORCH_CHECK(!grad.is_sparse(), optimizer,
              " does not support sparse gradients: ", describe_param(group, index, param));
  TORCH_CHECK(grad.sizes() == param.sizes(), optimizer, ": gradient of ",
              describe_param(group, index, param), " has shape ", grad.sizes());
}

GradItems collect_grads(const char* optimizer,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups,
                        const std::function<void(size_t)>& check_group,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& check_param) {
  GradItems items;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group(g);
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (!p.grad().defined()) continue;
      check_param(g, i, p);
      check_grad_kind(optimizer, g, i, p, p.grad());
      items.params.push_back(p);
      items.grads.push_back(p.grad());
      items.where.emplace_back(g, i);
    }
  }
  return items;
}

int64_t first_nonfinite(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return -1;
  std::vector<at::Tensor> flags;
  flags.reserve(tensors.size());
  for (const auto& t : tensors) flags.push_back(at::isfinite(t).all());
  const at::Tensor ok = at::stack(flags).cpu();  // the one synchronisation
  const bool* data = ok.data_ptr<bool>();
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!data[k]) return static_cast<int64_t>(k);
  }
  return -1;
}

void throw_nonfinite(const char* optimizer, size_t group, size_t index, const at::Tensor& param) {
  TORCH_CHECK(false, optimizer, ": gradient of ", describe_param(group, index, param),
              " contains NaN or Inf; the step was not applied (the parameters are unchanged)");
}

void load_transactional(torch::optim::Optimizer& optimizer, const std::function<void()>& load,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& validate) {
  ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> saved_state;
  for (const auto& [key, state] : optimizer.state()) saved_state[key] = state->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> saved_options;
  for (const auto& group : optimizer.param_groups())
    saved_options.push_back(group.options().clone());
  try {
    load();
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) validate(g, i, params[i]);
    }
  } catch (...) {
    optimizer.state() = std::move(saved_state);
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(saved_options[g]));
    throw;
  }
}

}  // namespace fogo::detail

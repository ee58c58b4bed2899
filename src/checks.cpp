#include "fogo/detail/checks.h"

#include <ATen/ATen.h>
#include <c10/util/flat_hash_map.h>
#include <fogo/step_shard.h>

#include <algorithm>
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
      items.params.push_back(p);
      items.grads.push_back(p.grad());
      items.where.emplace_back(g, i);
    }
  }
  return items;
}

namespace {
// A gradient's Frobenius norm, accumulated in float32 at least (as the Newton–Schulz input's
// normalisation and AdamW's second moment are).
at::Tensor grad_norm(const at::Tensor& grad) {
  const auto dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::linalg_vector_norm(grad, 2, {}, /*keepdim=*/false, dtype);
}

double max_grad_norm(const at::Tensor& grad) {
  return grad.scalar_type() == at::kDouble ? kMaxGradNormDouble : kMaxGradNorm;
}
}  // namespace

namespace {
thread_local bool grads_already_checked = false;
thread_local int64_t reads = 0;
}  // namespace

GradsAlreadyChecked::GradsAlreadyChecked() : previous_(grads_already_checked) {
  grads_already_checked = true;
}
GradsAlreadyChecked::~GradsAlreadyChecked() { grads_already_checked = previous_; }

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

int64_t unusable_grad_reads() { return reads; }

int64_t first_unusable_grad(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || grads_already_checked) return -1;
  ++reads;
  std::vector<at::Tensor> flags;
  flags.reserve(grads.size());
  // NaN <= x and Inf <= x are false: one reduction per gradient tests all three conditions.
  for (const auto& g : grads) flags.push_back(grad_norm(g) <= max_grad_norm(g));
  const at::Tensor ok = at::stack(flags).cpu();  // the one synchronisation
  const bool* data = ok.data_ptr<bool>();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!data[k]) return static_cast<int64_t>(k);
  }
  return -1;
}

namespace {
thread_local at::Tensor step_mask;
}  // namespace

StepMask::StepMask(at::Tensor ok) : previous_(std::move(step_mask)) { step_mask = std::move(ok); }
StepMask::~StepMask() { step_mask = std::move(previous_); }

at::Tensor grads_usable(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || grads_already_checked) return {};
  if (step_mask.defined()) return step_mask.to(grads.front().device());
  // One stacked test per device, in first-seen order, combined on the first device.
  std::vector<std::pair<at::Device, std::vector<at::Tensor>>> by_device;
  for (const auto& g : grads) {
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& d) { return d.first == g.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {g.device(), {}});
    it->second.push_back(grad_norm(g) <= max_grad_norm(g));
  }
  at::Tensor ok;
  for (const auto& [device, flags] : by_device) {
    const at::Tensor here = at::stack(flags).all();
    ok = ok.defined() ? at::logical_and(ok, here.to(ok.device())) : here;
  }
  return ok;
}

int64_t first_unusable_item(const GradItems& items, const std::function<bool(size_t)>& checked) {
  std::vector<at::Tensor> grads;
  std::vector<size_t> item;
  for (size_t k = 0; k < items.grads.size(); ++k) {
    if (checked(items.where[k].first)) {
      grads.push_back(items.grads[k]);
      item.push_back(k);
    }
  }
  const int64_t bad = first_unusable_grad(grads);
  return bad < 0 ? -1 : static_cast<int64_t>(item[bad]);
}

void throw_unusable_grad(const char* optimizer, size_t group, size_t index,
                         const at::Tensor& param) {
  const at::Tensor& grad = param.grad();
  const bool finite = at::isfinite(grad).all().item<bool>();
  TORCH_CHECK(false, optimizer, ": gradient of ", describe_param(group, index, param),
              finite ? " has Frobenius norm " + std::to_string(grad_norm(grad).item<double>()) +
                           " above " + std::to_string(max_grad_norm(grad)) +
                           ", where the update's arithmetic would overflow (a silent zero or Inf "
                           "update)"
                     : std::string(" contains NaN or Inf"),
              "; the step was not applied (the parameters are unchanged)");
}

void load_transactional(torch::optim::Optimizer& optimizer, const std::function<void()>& load,
                        const std::function<void(size_t, size_t, const at::Tensor&)>& validate) {
  ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>> saved_state;
  for (const auto& [key, state] : optimizer.state()) saved_state[key] = state->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> saved_options;
  for (const auto& group : optimizer.param_groups())
    saved_options.push_back(group.options().clone());
  try {
    // A checkpoint replaces the state (as torch.optim's load_state_dict does): LibTorch's load
    // only adds entries, which would keep newer state of parameters the checkpoint lacks.
    optimizer.state().clear();
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

namespace fogo {

bool StepShard::enabled(const char* optimizer) const {
  TORCH_CHECK(static_cast<bool>(owns) == static_cast<bool>(exchange), optimizer,
              ": a StepShard needs both owns and exchange, or neither");
  return static_cast<bool>(owns);
}

}  // namespace fogo

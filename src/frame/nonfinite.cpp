// The non-finite decision (fogo/nonfinite.h) and its machinery (fogo_private/frame/nonfinite.h).
#include "fogo_private/frame/nonfinite.h"

#include <ATen/ATen.h>

#include <string>

namespace fogo {
namespace {

thread_local int64_t reads = 0;  // decide_nonfinite's read-backs on this thread, for tests

// The flags of `items` stacked on the first one's device: [items.size()] bool.
at::Tensor stacked(const std::vector<at::Tensor>& usable, const std::vector<size_t>& items) {
  const at::Device device = usable[items.front()].device();
  std::vector<at::Tensor> flags;
  flags.reserve(items.size());
  for (const size_t k : items) flags.push_back(usable[k].reshape({}).to(device));
  return at::stack(flags);
}

}  // namespace

NonFiniteDecision decide_nonfinite(const std::vector<NonFinitePolicy>& policies,
                                   const std::vector<at::Tensor>& usable, bool maskable) {
  TORCH_CHECK(policies.size() == usable.size(), "decide_nonfinite: ", policies.size(),
              " policies for ", usable.size(), " flags");
  // Each item's policy at this step, and who reads its flag: the host (Raise, Skip) or the
  // device (Mask).
  std::vector<NonFinitePolicy> now(policies.size());
  std::vector<size_t> host, masked;
  for (size_t k = 0; k < policies.size(); ++k) {
    TORCH_CHECK(is_known(policies[k]), "decide_nonfinite: item ", k, " has the unknown policy ",
                static_cast<int64_t>(policies[k]));
    now[k] =
        policies[k] == NonFinitePolicy::Mask && !maskable ? NonFinitePolicy::Skip : policies[k];
    if (now[k] == NonFinitePolicy::Unchecked) continue;
    TORCH_CHECK(
        usable[k].defined() && usable[k].numel() == 1 && usable[k].scalar_type() == at::kBool,
        "decide_nonfinite: item ", k, " needs its usable flag (a one-element bool tensor)");
    (now[k] == NonFinitePolicy::Mask ? masked : host).push_back(k);
  }
  NonFiniteDecision d;
  if (!host.empty()) {
    ++reads;
    const at::Tensor flags = stacked(usable, host).cpu();  // the one synchronisation
    const bool* ok = flags.data_ptr<bool>();
    for (size_t j = 0; j < host.size(); ++j) {
      if (ok[j]) continue;
      if (now[host[j]] == NonFinitePolicy::Raise) {
        d.kind = NonFiniteDecision::Kind::Raise;
        d.item = static_cast<int64_t>(host[j]);
        return d;
      }
      if (d.item < 0) {  // Skip, unless a later Raise item is unusable too
        d.kind = NonFiniteDecision::Kind::Skip;
        d.item = static_cast<int64_t>(host[j]);
      }
    }
    if (d.kind == NonFiniteDecision::Kind::Skip) return d;
  }
  if (!masked.empty()) {
    d.kind = NonFiniteDecision::Kind::Mask;
    d.ok = stacked(usable, masked).all();
  }
  return d;
}

namespace detail {

at::Tensor grad_norm(const at::Tensor& grad) {
  const auto dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::linalg_vector_norm(grad, 2, {}, /*keepdim=*/false, dtype);
}

namespace {
double max_grad_norm(at::ScalarType dtype) {
  return dtype == at::kDouble ? kMaxGradNormDouble : kMaxGradNorm;
}
}  // namespace

at::Tensor norm_usable(const at::Tensor& norm, at::ScalarType dtype) {
  return norm <= max_grad_norm(dtype);
}

at::Tensor grad_usable(const at::Tensor& grad) {
  return norm_usable(grad_norm(grad), grad.scalar_type());
}

std::vector<at::Tensor> usable_flags(const std::vector<NonFinitePolicy>& policies,
                                     const std::vector<at::Tensor>& grads) {
  TORCH_INTERNAL_ASSERT(policies.size() == grads.size());
  std::vector<at::Tensor> flags(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) {
    if (policies[k] != NonFinitePolicy::Unchecked) flags[k] = grad_usable(grads[k]);
  }
  return flags;
}

int64_t unusable_grad_reads() { return reads; }

void throw_unusable_grad(const std::string& optimizer, const std::string& what,
                         const at::Tensor& grad) {
  std::string problem;
  if (!grad.defined()) {
    problem =
        " contains NaN or Inf, or has a norm where the update's arithmetic would overflow, "
        "on some rank";
  } else if (!at::isfinite(grad).all().item<bool>()) {
    problem = " contains NaN or Inf";
  } else {
    problem = " has Frobenius norm " + std::to_string(grad_norm(grad).item<double>()) + " above " +
              std::to_string(max_grad_norm(grad.scalar_type())) +
              ", where the update's arithmetic would overflow (a silent zero or Inf update)";
  }
  TORCH_CHECK(false, optimizer, ": gradient of ", what, problem,
              "; the step was not applied (the parameters are unchanged)");
}

MaskScope::MaskScope(at::Tensor ok, std::vector<at::Tensor> tensors)
    : ok_(std::move(ok)), tensors_(std::move(tensors)) {
  if (!ok_.defined()) return;
  for (const at::Tensor& t : tensors_) before_.push_back(t.defined() ? t.clone() : t);
}

void MaskScope::restore(const std::vector<at::Tensor>& now) const {
  if (!ok_.defined()) return;
  TORCH_INTERNAL_ASSERT(now.size() == before_.size(), "MaskScope::restore: ", now.size(),
                        " tensors for ", before_.size(), " copies");
  for (size_t k = 0; k < now.size(); ++k) {
    if (!before_[k].defined()) continue;
    at::Tensor t = now[k];
    t.copy_(at::where(ok_.to(t.device()), t, before_[k]));
  }
}

}  // namespace detail
}  // namespace fogo

// Muon's update (fogo_private/muon/update.h): the learning-rate scale conventions, the decay and
// the ATen reference of the update, which ops::muon_update dispatches (CUDA: cuda/update.cu).
#include "fogo_private/muon/update.h"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>
#include <vector>

#include "fogo/muon.h"

namespace fogo {

std::pair<double, double> muon_adjusted_lr_factors(MuonAdjustLR rule, int64_t A, int64_t B,
                                                   double extra_scale_factor) {
  switch (rule) {
    case MuonAdjustLR::Original:
      return {std::sqrt(std::max(1.0, static_cast<double>(A) / static_cast<double>(B))),
              extra_scale_factor};
    case MuonAdjustLR::MatchRmsAdamW:
      // torch.optim.Muon's order, lr * (0.2 * sqrt(max(A, B))): lr * 0.2 * sqrt(...) rounds
      // differently, which float64 parameters show.
      return {0.2 * std::sqrt(static_cast<double>(std::max(A, B))), extra_scale_factor};
    case MuonAdjustLR::Spectral:
      // sqrt(fan_out / fan_in) of the matrix view, below 1 for a wide matrix (no clamp).
      return {std::sqrt(static_cast<double>(A) / static_cast<double>(B)), extra_scale_factor};
  }
  TORCH_CHECK(false, "Muon: unknown adjust_lr rule ", static_cast<int64_t>(rule));
}

double muon_adjusted_lr(double lr, MuonAdjustLR rule, int64_t A, int64_t B, at::ScalarType lr_dtype,
                        double extra_scale_factor) {
  // lr f1 f2, left to right: lr * ratio * extra_scale_factor (times 1 by default, exact), as
  // torch.optim.Muon's _adjust_lr.
  const auto [f1, f2] = muon_adjusted_lr_factors(rule, A, B, extra_scale_factor);
  return LearningRate(lr, lr_dtype).scaled(f1, f2);
}

double muon_decay(double lr, double weight_decay, at::ScalarType lr_dtype) {
  return LearningRate(lr, lr_dtype).decay(weight_decay);
}

void ref::muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p) {
  if (items.empty()) return;
  if (p.ok.defined()) {  // Mask: the update unmasked, then each parameter selected back
    std::vector<at::Tensor> before;
    for (const MuonUpdateItem& item : items) before.push_back(item.param.clone());
    MuonUpdateParams unmasked = p;
    unmasked.ok = at::Tensor();
    ref::muon_update(items, unmasked);
    for (size_t k = 0; k < items.size(); ++k)
      items[k].param.copy_(at::where(p.ok, items[k].param, before[k]));
    return;
  }
  if (!p.lr.on_device()) {
    // torch.optim.Muon's ops, per tensor, as Python dispatches them: `param.mul_(float)` is
    // mul_.Tensor with a wrapped 0-d double on the CPU, whatever the parameter's device. C++'s
    // mul_(double) (mul_.Scalar) and _foreach_mul_ round a bf16 parameter's product differently
    // (1-4 bf16 ulps per step, measured). The same tensor on every device: a copy on a GPU is
    // no wrapped number (TensorIterator would round 1 - lr wd to a bf16 parameter's precision,
    // 0.998 to 0.99609375, doubling the decay) and a blocking host-to-device copy.
    at::Tensor decay = at::scalar_tensor(p.lr.decay(p.weight_decay), at::kDouble);
    decay.unsafeGetTensorImpl()->set_wrapped_number(true);
    for (const MuonUpdateItem& item : items) {
      item.param.mul_(decay);
      const auto [rows, cols] = adjusted_lr_shape(item);
      const auto [f1, f2] = muon_adjusted_lr_factors(p.adjust_lr, rows, cols, p.extra_scale);
      item.param.add_(item.O.reshape(item.param.sizes()), -p.lr.scaled(f1, f2));
    }
    return;
  }
  // A CUDA graph's learning rate, read on the device: the same update in the parameter's
  // precision (fp32 for bf16/fp16 ones, one rounding at the end), to rounding.
  const at::Tensor decay = p.lr.decay_on_device(p.weight_decay);
  for (const MuonUpdateItem& item : items) {
    const at::Tensor& param = item.param;
    const auto [rows, cols] = adjusted_lr_shape(item);
    const auto [f1, f2] = muon_adjusted_lr_factors(p.adjust_lr, rows, cols, p.extra_scale);
    const at::Tensor step = p.lr.scaled_on_device(f1, f2);
    const auto type = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor o = item.O.reshape(param.sizes()).to(type);
    param.copy_(param.to(type) * decay.to(type) - o * step.to(type));
  }
}

}  // namespace fogo

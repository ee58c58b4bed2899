#pragma once
// Step 9 (paper: "Projection Back to Original Space and Parameter Update"): the RMS-scaled
// update with decoupled weight decay,
//   gamma_t = sigma sqrt(m n) / (|Ohat|_F + eps),  theta <- (1 - lr wd) theta - lr gamma_t Ohat,
// with Ohat = O_s + delta.

#include <ATen/Tensor.h>
#include <fogo/device_step.h>

#include <vector>

namespace fogo {

struct UpdateParams {
  /// On the host, or on the device (a replayed CUDA graph's, lr.device): the arithmetic is the
  /// same either way (double, then one rounding), so the results are too.
  LearningRate lr;
  double weight_decay, sigma, eps;
};

/// One parameter's update: `Os` (fp32, or the Newton–Schulz compute dtype, read as is) and
/// `delta` (fp32) are [m, n] in the working orientation; `transposed` says the parameter's 2-D
/// view is their transpose. `param` is updated in place.
struct RmsUpdateItem {
  at::Tensor param, Os, delta;
  bool transposed = false;
};

/// Applies the update to every item's parameter, each with its own gamma_t. With `ok` (a 0-d
/// bool on the parameters' device: NonFinitePolicy::Mask) a parameter keeps every bit where ok
/// is false. Returns |delta|_F / (|O_s|_F + eps) of each item as a 0-d tensor (telemetry; no
/// host synchronisation).
namespace ref {
std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok = {});
}  // namespace ref

}  // namespace fogo

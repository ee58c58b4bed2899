#pragma once
// Step 9 (paper: "Projection Back to Original Space and Parameter Update"): the RMS-scaled
// update with decoupled weight decay,
//   gamma_t = sigma sqrt(m n) / (|Ohat|_F + eps),  theta <- (1 - lr wd) theta - lr gamma_t Ohat,
// with Ohat = O_s + delta.

#include <ATen/Tensor.h>

namespace fogo {

struct UpdateParams {
  double lr, weight_decay, sigma, eps;
  /// When defined, the learning rate instead of `lr`: a 0-d float64 tensor on the parameter's
  /// device, read when the update runs (a replayed CUDA graph uses its current value). The
  /// arithmetic is the same as with `lr` (double, then one rounding), so the results are too.
  at::Tensor device_lr = {};
};

/// Applies the update to `param` in place. `Os` (fp32, or the Newton–Schulz compute dtype, read
/// as is) and `delta` (fp32) are [m, n] in the working orientation; `transposed` says the
/// parameter's 2-D view is their transpose. Returns |delta|_F / (|O_s|_F + eps) as a 0-d tensor
/// (telemetry; no host synchronisation).
/// Throws unless `p.device_lr` is undefined or a 0-d float64 tensor on param's device.
void check_device_lr(const at::Tensor& param, const UpdateParams& p);

at::Tensor apply_rms_update(at::Tensor& param, const at::Tensor& Os, const at::Tensor& delta,
                            bool transposed, const UpdateParams& p);

}  // namespace fogo

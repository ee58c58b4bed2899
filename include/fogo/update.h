#pragma once
// Step 9 (paper: "Projection Back to Original Space and Parameter Update"): the RMS-scaled
// update with decoupled weight decay,
//   gamma_t = sigma sqrt(m n) / (|Ohat|_F + eps),  theta <- (1 - lr wd) theta - lr gamma_t Ohat,
// with Ohat = O_s + delta.

#include <ATen/Tensor.h>

namespace fogo {

struct UpdateParams {
  double lr, weight_decay, sigma, eps;
};

/// Applies the update to `param` in place. `Os` (fp32, or the Newton–Schulz compute dtype, read
/// as is) and `delta` (fp32) are [m, n] in the working orientation; `transposed` says the
/// parameter's 2-D view is their transpose. Returns |delta|_F / (|O_s|_F + eps) as a 0-d tensor
/// (telemetry; no host synchronisation).
at::Tensor apply_rms_update(at::Tensor& param, const at::Tensor& Os, const at::Tensor& delta,
                            bool transposed, const UpdateParams& p);

}  // namespace fogo

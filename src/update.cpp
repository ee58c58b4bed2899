#include "fogo/update.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fogo {

at::Tensor apply_rms_update(at::Tensor& param, const at::Tensor& Os, const at::Tensor& delta,
                            bool transposed, const UpdateParams& p) {
  // Ohat in the wider of O_s's dtype and fp32 (delta is fp32; O_s is fp32, the NS compute dtype,
  // or fp64 with ns_dtype(kDouble)).
  const at::Tensor Ohat = Os + delta;
  const double mn = static_cast<double>(Os.size(0) * Os.size(1));
  const at::Tensor step = (p.lr * p.sigma * std::sqrt(mn)) / (Ohat.norm() + p.eps);  // lr gamma_t
  const at::Tensor update = (transposed ? Ohat.t() : Ohat).reshape(param.sizes());
  const auto type = param.scalar_type();
  if (type == at::kFloat || type == at::kDouble) {  // in the parameter's own precision
    param.mul_(1.0 - p.lr * p.weight_decay).sub_(update * step);
  } else {  // bf16/fp16 parameters: the arithmetic in fp32, one rounding at the end
    param.copy_(param.to(at::kFloat).mul_(1.0 - p.lr * p.weight_decay).sub_(update * step));
  }
  const at::ScalarType norm_type = at::promote_types(Os.scalar_type(), at::kFloat);
  return delta.norm() / (at::linalg_vector_norm(Os, 2, {}, false, norm_type) + p.eps);
}

}  // namespace fogo

#include "fogo/update.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fogo {

at::Tensor apply_rms_update(at::Tensor& param, const at::Tensor& Os, const at::Tensor& delta,
                            bool transposed, const UpdateParams& p) {
  const at::Tensor Ohat = Os + delta;  // fp32: delta is fp32, Os fp32 or the NS compute dtype
  const double mn = static_cast<double>(Os.size(0) * Os.size(1));
  const at::Tensor step = (p.lr * p.sigma * std::sqrt(mn)) / (Ohat.norm() + p.eps);  // lr gamma_t
  const at::Tensor update = (transposed ? Ohat.t() : Ohat).reshape(param.sizes());
  if (param.scalar_type() == at::kFloat) {
    param.mul_(1.0 - p.lr * p.weight_decay).sub_(update * step);
  } else {  // low-precision parameters: the arithmetic in fp32, one rounding at the end
    param.copy_(param.to(at::kFloat).mul_(1.0 - p.lr * p.weight_decay).sub_(update * step));
  }
  return delta.norm() / (at::linalg_vector_norm(Os, 2, {}, false, at::kFloat) + p.eps);
}

}  // namespace fogo

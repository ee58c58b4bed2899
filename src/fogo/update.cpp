#include "fogo_private/fogo/update.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fogo {

namespace {

at::Tensor update_one(const RmsUpdateItem& item, const UpdateParams& p) {
  at::Tensor param = item.param;
  const at::Tensor &Os = item.Os, &delta = item.delta;
  // Ohat in the wider of O_s's dtype and fp32 (delta is fp32; O_s is fp32, the NS compute dtype,
  // or fp64 with ns_dtype(kDouble)).
  const at::Tensor Ohat = Os + delta;
  const double mn = static_cast<double>(Os.size(0) * Os.size(1));
  const at::Tensor norm = Ohat.norm() + p.eps;
  // lr gamma_t and the decay 1 - lr wd: in double, rounded once to the working type (as a host
  // scalar is when an op takes it), whether lr is on the host or on the device.
  const bool on_device = p.lr.on_device();
  p.lr.check_device(param.device(), "apply_rms_update");
  const at::Tensor step =
      on_device ? p.lr.scaled_on_device(p.sigma, std::sqrt(mn)).to(norm.scalar_type()) / norm
                : p.lr.scaled(p.sigma, std::sqrt(mn)) / norm;
  const auto decay = [&](at::Tensor x) {
    return on_device ? x.mul_(p.lr.decay_on_device(p.weight_decay).to(x.scalar_type()))
                     : x.mul_(p.lr.decay(p.weight_decay));
  };
  const at::Tensor update = (item.transposed ? Ohat.t() : Ohat).reshape(param.sizes());
  const auto type = param.scalar_type();
  if (type == at::kFloat || type == at::kDouble) {  // in the parameter's own precision
    decay(param).sub_(update * step);
  } else {  // bf16/fp16 parameters: the arithmetic in fp32, one rounding at the end
    param.copy_(decay(param.to(at::kFloat)).sub_(update * step));
  }
  const at::ScalarType norm_type = at::promote_types(Os.scalar_type(), at::kFloat);
  return delta.norm() / (at::linalg_vector_norm(Os, 2, {}, false, norm_type) + p.eps);
}

}  // namespace

std::vector<at::Tensor> ref::apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                              const UpdateParams& p, const at::Tensor& ok) {
  std::vector<at::Tensor> ratios;
  for (const RmsUpdateItem& item : items) {
    const at::Tensor before = ok.defined() ? item.param.clone() : at::Tensor();
    ratios.push_back(update_one(item, p));
    if (ok.defined()) item.param.copy_(at::where(ok, item.param, before));
  }
  return ratios;
}

}  // namespace fogo

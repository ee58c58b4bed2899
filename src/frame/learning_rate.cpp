// The learning rate of a step (fogo/device_step.h): its host scalars in their
// dtype and its device scalars, resolved here for FOGO's and Muon's updates alike.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fogo/device_step.h>

namespace fogo {

namespace {

// torch.optim.Muon's step with a Tensor lr: the value as a 0-d tensor of its dtype (exact: the
// value is that tensor's), whose products with Python floats are ATen's 0-d ops in that dtype.
at::Tensor host_tensor(double value, at::ScalarType dtype) {
  return at::scalar_tensor(value, at::TensorOptions().dtype(dtype));
}

}  // namespace

const double* LearningRate::device_ptr() const {
  return device.defined() ? device.data_ptr<double>() : nullptr;
}

void LearningRate::check_device(const c10::Device& where, const char* who) const {
  if (!device.defined()) return;
  TORCH_CHECK(device.dim() == 0 && device.scalar_type() == at::kDouble && device.device() == where,
              who, ": device_lr must be a 0-d float64 tensor on ", where, ", got ", device.sizes(),
              " ", device.scalar_type(), " on ", device.device());
}

double LearningRate::scaled(double f1, double f2) const {
  if (dtype == at::kDouble) return value * f1 * f2;
  return (host_tensor(value, dtype) * f1 * f2).item<double>();
}

double LearningRate::decay(double weight_decay) const {
  if (dtype == at::kDouble) return 1.0 - value * weight_decay;
  // Python's `1 - lr * weight_decay` on a tensor: mul by a wrapped double, then rsub.
  return at::rsub(host_tensor(value, dtype) * weight_decay, 1).item<double>();
}

at::Tensor LearningRate::scaled_on_device(double f1, double f2) const { return device * f1 * f2; }

at::Tensor LearningRate::decay_on_device(double weight_decay) const {
  return 1.0 - device * weight_decay;
}

}  // namespace fogo

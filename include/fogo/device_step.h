#pragma once
// What a matrix optimizer's device step reads (fogo::GroupFrame::device_step, matrix_optimizer.h):
// its param group's parameters and gradients, the Mask flag, the learning rate and the
// optimizer's own per-step tensors. The same for a step run eagerly and for one replayed from a
// CUDA graph, whose static inputs these are. Public, so that an optimizer written outside fogo
// on its frame (tests/test_third_optimizer.cpp is one) needs nothing private.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace fogo {

/// A param group's learning rate as a step's arithmetic uses it, one type from the options to the
/// parameter write: its value, the dtype the host arithmetic rounds in, and, in a CUDA graph's
/// step, the device scalar the graph reads (refreshed before each replay). Every scalar a step
/// derives from lr (lr f1 f2, 1 - lr wd) is resolved here, in one place.
struct LearningRate {
  /// The group's lr (its options' get_lr()).
  double value = 0.0;
  /// The precision of the host arithmetic: double by default; a Tensor lr's dtype for
  /// torch.optim.Muon's bits with one (it computes lr's scalars with 0-d ops in that dtype).
  at::ScalarType dtype = at::kDouble;
  /// When defined, the learning rate read on the device instead of `value` (a 0-d float64
  /// tensor on the parameters' device: a replayed CUDA graph uses its current value); the
  /// products are then taken in double on the device whatever `dtype` says.
  at::Tensor device;

  LearningRate() = default;
  // Implicit from a double: a plain learning rate (double arithmetic, on the host).
  LearningRate(double value, at::ScalarType dtype = at::kDouble, at::Tensor device = {})  // NOLINT
      : value(value), dtype(dtype), device(std::move(device)) {}

  bool on_device() const { return device.defined(); }
  /// The device scalar for a kernel (null on the host).
  const double* device_ptr() const;
  /// Throws, naming `who`, unless the learning rate is on the host or a 0-d float64 tensor on
  /// `where`.
  void check_device(const c10::Device& where, const char* who) const;

  /// lr f1 f2 (left to right) in `dtype`, on the host.
  double scaled(double f1, double f2 = 1.0) const;
  /// 1 - lr weight_decay in `dtype`, on the host.
  double decay(double weight_decay) const;
  /// lr f1 f2 on the device (0-d float64), from `device`.
  at::Tensor scaled_on_device(double f1, double f2 = 1.0) const;
  /// 1 - lr weight_decay on the device (0-d float64), from `device`.
  at::Tensor decay_on_device(double weight_decay) const;
};

/// What one param group's device step reads: the same for a step run eagerly and for one run from
/// a CUDA graph (whose static inputs these are).
struct StepInputs {
  size_t group = 0;
  std::vector<at::Tensor> params, grads;
  /// NonFinitePolicy::Mask: the step's flag (0-d bool on the group's device), else undefined:
  /// where it is false the step leaves every tensor as it was.
  at::Tensor ok;
  /// On the host eagerly; in a graph, on the device (lr.device).
  LearningRate lr;
  /// The optimizer's own per-step tensors, prepared on the host (FOGO's candidate keys); an
  /// undefined one stays undefined.
  std::vector<at::Tensor> extra;
};

}  // namespace fogo

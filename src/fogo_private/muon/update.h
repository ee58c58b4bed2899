#pragma once
// fogo::Muon's update (ALGORITHM-free: torch.optim.Muon's), the one stage of Muon that ops.h
// dispatches: the ATen reference here, a multi-tensor CUDA kernel in cuda/.

#include <ATen/Tensor.h>
#include <fogo/device_step.h>
#include <fogo/muon_options.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace fogo {

/// One parameter of Muon's update: `param` (any shape, its matrix view [A, B] = [size(0),
/// numel / size(0)]) and its orthogonalized momentum O [A, B] (the Newton–Schulz compute dtype).
struct MuonUpdateItem {
  at::Tensor param, O;
  /// Where `param` and O are some rows of a larger matrix (muon_step_rows): that matrix's shape
  /// [A, B], whose adjusted learning rate applies; 0: param's own matrix view.
  int64_t rows = 0, cols = 0;
};

/// The matrix shape [A, B] whose adjusted learning rate (muon_adjusted_lr) `item` takes.
inline std::pair<int64_t, int64_t> adjusted_lr_shape(const MuonUpdateItem& item) {
  if (item.rows > 0) return {item.rows, item.cols};
  const int64_t rows = item.param.size(0);
  return {rows, item.param.numel() / std::max<int64_t>(rows, 1)};
}

struct MuonUpdateParams {
  /// The step's learning rate: on the host in its dtype (1 - lr wd and the adjusted lr rounded
  /// as muon_decay and muon_adjusted_lr round them), or on the device (a replayed CUDA graph's).
  LearningRate lr;
  double weight_decay = 0.0;
  MuonAdjustLR adjust_lr = MuonAdjustLR::Original;
  /// NonFinitePolicy::Mask: when defined (a 0-d bool on the parameters' device), where it is
  /// false every parameter keeps every bit. The CUDA kernel reads it and writes nothing (no copy
  /// of the parameters before the step: issue 44); the reference selects its result back.
  at::Tensor ok = {};
  /// MuonOptions::extra_scale_factor: the adjusted lr's second factor (muon_adjusted_lr_factors).
  double extra_scale = 1.0;
};

/// Muon's update of every item, the ATen reference (ops::muon_update dispatches to a CUDA
/// kernel computing the same bits):
///   p *= 1 - lr wd                 (mul_ by a wrapped double, as torch.optim.Muon's Python does)
///   p += -muon_adjusted_lr(lr) O   (add_ with alpha)
/// both scalars computed in lr.dtype (muon_decay, muon_adjusted_lr).
/// With lr on the device the same products in double, rounded once, in the parameter's precision
/// (fp32 for bf16/fp16 parameters). With `ok` false, nothing changes.
namespace ref {
void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p);
}  // namespace ref

}  // namespace fogo

#pragma once
// The non-finite policy's machinery (fogo/nonfinite.h decides; this tests and applies): which
// gradients are usable, the error naming an unusable one, and Mask's restore.

#include <ATen/Tensor.h>
#include <fogo/nonfinite.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fogo::detail {

/// Largest Frobenius norm a float32/bf16/fp16 (double) gradient may have. Above about 1.8e19
/// (1.3e154) its square overflows: the Newton–Schulz input's normalisation X / |X| would give a
/// silent zero update, AdamW's second moment Inf. The margin of ~180 covers the momentum buffer,
/// which sums up to 1 / (1 - momentum) gradients (momentum <= 0.994).
inline constexpr double kMaxGradNorm = 1e17;
inline constexpr double kMaxGradNormDouble = 1e151;

/// A gradient's Frobenius norm, accumulated in float32 at least (as the Newton–Schulz input's
/// normalisation and AdamW's second moment are): a 0-d float32 (float64 for a double gradient).
at::Tensor grad_norm(const at::Tensor& grad);

/// Whether `norm`, the Frobenius norm of a gradient of dtype `dtype`, makes it usable: finite
/// and at most kMaxGradNorm (kMaxGradNormDouble for double). NaN <= x and Inf <= x are false, so
/// one comparison tests all three conditions. A 0-d bool on norm's device; nothing is read back.
at::Tensor norm_usable(const at::Tensor& norm, at::ScalarType dtype);

/// norm_usable(grad_norm(grad), grad's dtype): decide_nonfinite's flag for one gradient.
at::Tensor grad_usable(const at::Tensor& grad);

/// Each item's flag for decide_nonfinite: grad_usable(grads[k]), undefined where the policy is
/// Unchecked (never tested).
std::vector<at::Tensor> usable_flags(const std::vector<NonFinitePolicy>& policies,
                                     const std::vector<at::Tensor>& grads);

/// How many times decide_nonfinite has read flags back to the host on this thread (on a GPU,
/// each is a host synchronisation): what tests count.
int64_t unusable_grad_reads();

/// The error for an unusable gradient `grad` of `what` (describe_param's text, say): what is
/// wrong with it (non-finite, or its norm too large) and that nothing was changed. An undefined
/// `grad` stands for one this process does not hold whole (a DTensor's, usable here but not on
/// some other rank).
[[noreturn]] void throw_unusable_grad(const std::string& optimizer, const std::string& what,
                                      const at::Tensor& grad);

/// NonFinitePolicy::Mask's restore, for every optimizer: copies of the tensors a step may change,
/// taken when the scope is made, put back by restore() wherever the step's flag `ok` is false
/// (where it is true every tensor keeps its bits). Nothing is copied when `ok` is undefined (the
/// step is not masked) or for an undefined tensor.
class MaskScope {
 public:
  MaskScope(at::Tensor ok, std::vector<at::Tensor> tensors);
  /// Into `now`: the same tensors, in the same order, as they are after the step (a step may
  /// have replaced one by a new tensor).
  void restore(const std::vector<at::Tensor>& now) const;
  void restore() const { restore(tensors_); }

 private:
  at::Tensor ok_;
  std::vector<at::Tensor> tensors_, before_;
};

}  // namespace fogo::detail

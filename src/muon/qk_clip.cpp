// QK-Clip (fogo/qk_clip.h): the per-group scales, and the rows of the projections scaled by them.
#include "fogo/qk_clip.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace fogo {

namespace {

void check_heads(const QKHeads& h) {
  TORCH_CHECK_VALUE(h.q_heads >= 1 && h.kv_heads >= 1 && h.head_dim >= 1,
                    "qk_clip: q_heads, kv_heads and head_dim must be >= 1, got ", h.q_heads, ", ",
                    h.kv_heads, ", ", h.head_dim);
  TORCH_CHECK_VALUE(h.q_heads % h.kv_heads == 0, "qk_clip: q_heads (", h.q_heads,
                    ") must be a multiple of kv_heads (", h.kv_heads, ")");
}

void check_alpha(double alpha) {
  TORCH_CHECK_VALUE(alpha >= 0.0 && alpha <= 1.0, "qk_clip: alpha must be in [0, 1], got ", alpha);
}

// A projection's rows and their bias: the whole (`first_row` -1: `total` rows) or a shard from
// `first_row` on.
void check_rows(const at::Tensor& w, const at::Tensor& b, int64_t first_row, int64_t total,
                const char* what) {
  TORCH_CHECK_VALUE(w.defined() && w.dim() == 2 && at::isFloatingType(w.scalar_type()),
                    "qk_clip: ", what, " must be a 2-D floating-point [rows, in] tensor, got ",
                    w.defined() ? c10::str(w.sizes(), " ", w.scalar_type()) : "none");
  if (first_row < 0) {
    TORCH_CHECK_VALUE(w.size(0) == total, "qk_clip: ", what, " has ", w.size(0),
                      " rows, the heads' layout ", total, " (a row shard names its first_row)");
  } else {
    TORCH_CHECK_VALUE(first_row + w.size(0) <= total, "qk_clip: ", what, " holds rows ", first_row,
                      " to ", first_row + w.size(0), " of a projection of ", total,
                      " rows (the heads' layout)");
  }
  TORCH_CHECK_VALUE(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0) &&
                                     at::isFloatingType(b.scalar_type())),
                    "qk_clip: the bias of ", what, " must be 1-D with its ", w.size(0),
                    " rows, got ", b.defined() ? c10::str(b.sizes()) : "");
}

// The factor of each row of [q | k | v] (float64, CPU; v rows 1), for gamma per group.
at::Tensor row_factors(const at::Tensor& gamma, const QKHeads& h, double alpha, bool with_v) {
  const int64_t group = h.q_heads / h.kv_heads;
  const at::Tensor q = gamma.pow(alpha).repeat_interleave(group * h.head_dim);
  const at::Tensor k = gamma.pow(1.0 - alpha).repeat_interleave(h.head_dim);
  return with_v ? at::cat({q, k, at::ones_like(k)}) : at::cat({q, k});
}

// Rows of `w` (and `b`) times `f`, computed in at least fp32 (a bf16 factor would move the
// clipped logit by up to 0.4%).
void scale_rows(at::Tensor& w, at::Tensor& b, const at::Tensor& f) {
  const auto type = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor on = f.to(w.device(), type);
  w.mul_(on.unsqueeze(1));
  if (b.defined()) b.mul_(on);
}

}  // namespace

std::vector<int64_t> qkv_blocks(const QKHeads& h) {
  check_heads(h);
  return {h.q_heads * h.head_dim, h.kv_heads * h.head_dim, h.kv_heads * h.head_dim};
}

at::Tensor qk_clip_scales(const at::Tensor& max_logits, const QKHeads& h, double threshold) {
  check_heads(h);
  TORCH_CHECK_VALUE(std::isfinite(threshold) && threshold > 0.0,
                    "qk_clip: threshold must be finite and > 0, got ", threshold);
  TORCH_CHECK_VALUE(max_logits.defined() && max_logits.dim() == 1 &&
                        max_logits.size(0) == h.q_heads &&
                        at::isFloatingType(max_logits.scalar_type()),
                    "qk_clip: max_logits must be a 1-D floating-point tensor of the ", h.q_heads,
                    " query heads' maximum logits, got ",
                    max_logits.defined() ? c10::str(max_logits.sizes()) : "none");
  const at::Tensor m = max_logits.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* v = m.data_ptr<double>();
  for (int64_t i = 0; i < h.q_heads; ++i)
    TORCH_CHECK_VALUE(std::isfinite(v[i]), "qk_clip: max_logits of query head ", i, " is ", v[i],
                      " (a non-finite logit: the step diverged; nothing was scaled)");
  // Each key head's group by its largest logit; gamma = tau / max above tau, else 1.
  const at::Tensor group_max = std::get<0>(m.view({h.kv_heads, -1}).max(1));
  return at::where(group_max > threshold, at::full_like(group_max, threshold).div(group_max),
                   at::ones_like(group_max));
}

at::Tensor qk_clip(at::Tensor weight, at::Tensor bias, const at::Tensor& max_logits,
                   const QKHeads& h, double threshold, double alpha, int64_t first_row) {
  check_alpha(alpha);
  const at::Tensor gamma = qk_clip_scales(max_logits, h, threshold);
  check_rows(weight, bias, first_row, (h.q_heads + 2 * h.kv_heads) * h.head_dim,
             "the fused [q | k | v] weight");
  const at::Tensor f = row_factors(gamma, h, alpha, /*with_v=*/true);
  scale_rows(weight, bias, f.narrow(0, std::max<int64_t>(first_row, 0), weight.size(0)));
  return gamma;
}

at::Tensor qk_clip_separate(at::Tensor q_weight, at::Tensor q_bias, at::Tensor k_weight,
                            at::Tensor k_bias, const at::Tensor& max_logits, const QKHeads& h,
                            double threshold, double alpha) {
  check_alpha(alpha);
  const at::Tensor gamma = qk_clip_scales(max_logits, h, threshold);
  const int64_t q_rows = h.q_heads * h.head_dim, k_rows = h.kv_heads * h.head_dim;
  check_rows(q_weight, q_bias, -1, q_rows, "the query weight");
  check_rows(k_weight, k_bias, -1, k_rows, "the key weight");
  const at::Tensor f = row_factors(gamma, h, alpha, /*with_v=*/false);
  scale_rows(q_weight, q_bias, f.narrow(0, 0, q_rows));
  scale_rows(k_weight, k_bias, f.narrow(0, q_rows, k_rows));
  return gamma;
}

}  // namespace fogo

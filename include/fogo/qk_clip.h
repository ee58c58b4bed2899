#pragma once
// QK-Clip (MuonClip, as Kimi K2 trained with it; Megatron-LM's clip_qk): after the optimizer step,
// every attention head whose largest pre-softmax logit of the step exceeded a threshold tau has its
// query and key projections scaled so that this logit would be tau:
//
//   gamma = tau / max_logit   (1 where max_logit <= tau: those heads are untouched)
//   query rows of the head *= gamma^alpha,   key rows *= gamma^(1 - alpha)
//
// so every logit q.k of the head is multiplied by gamma (the biases, where the projections have
// them, with their rows: q = W_q x + b_q). The logit is the softmax's input, scale 1/sqrt(d)
// included, the maximum over the step's batch, positions and (data parallel) ranks: the caller
// all-reduces it (MAX) over every rank that saw other data before calling.
//
// GQA: a key head serves q_heads / kv_heads query heads; its gamma is that of the largest logit
// of its group (Megatron-LM's rule), applied to every query head of the group and to the key
// head, so no logit of the group stays above tau. With kv_heads == q_heads it is the per-head
// rule of Kimi K2's paper.
//
// A head whose logit is at or below tau (zero, negative) keeps gamma 1: no negative base, so no
// NaN from gamma^alpha (a fix Megatron-LM's MLA path needed later). Non-finite logits are refused.
// Every check runs before anything changes. Sharded weights: `first_row` says which rows of the
// whole projection a tensor holds (a row shard of FSDP2, of fogo's owner-computes), so each rank
// scales its own rows, whichever heads they belong to. docs/muon.md, "QK-Clip".

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace fogo {

/// The heads of an attention's projections: q_heads query heads and kv_heads key (and value)
/// heads of head_dim rows each; q_heads a multiple of kv_heads (GQA; equal: multi-head).
struct QKHeads {
  int64_t q_heads = 1, kv_heads = 1, head_dim = 1;
};

/// A fused projection's row blocks, [q | k | v]: {q_heads * head_dim, kv_heads * head_dim,
/// kv_heads * head_dim}, the `blocks` option of Muon and FOGO for that weight.
std::vector<int64_t> qkv_blocks(const QKHeads& heads);

/// gamma of each key head's group (float64, CPU, [kv_heads]) for the step's per-query-head
/// maximum logits `max_logits` ([q_heads], any floating dtype and device), after the checks:
/// heads, `threshold` finite and > 0, `max_logits`' shape and finiteness (naming the head).
at::Tensor qk_clip_scales(const at::Tensor& max_logits, const QKHeads& heads, double threshold);

/// QK-Clip of a fused [q | k | v] projection (qkv_blocks' rows), in place: `weight` [rows, in]
/// is the whole projection (`first_row` -1, the default: its rows must be the heads'), or a row
/// shard holding the rows from `first_row` on; `bias` (undefined: none) the same rows' biases.
/// Returns qk_clip_scales'. `alpha` in [0, 1].
at::Tensor qk_clip(at::Tensor weight, at::Tensor bias, const at::Tensor& max_logits,
                   const QKHeads& heads, double threshold, double alpha = 0.5,
                   int64_t first_row = -1);

/// QK-Clip of separate query and key projections ([q_heads * head_dim, in] and [kv_heads *
/// head_dim, in]; biases optional), in place, whole. Returns qk_clip_scales'.
at::Tensor qk_clip_separate(at::Tensor q_weight, at::Tensor q_bias, at::Tensor k_weight,
                            at::Tensor k_bias, const at::Tensor& max_logits, const QKHeads& heads,
                            double threshold, double alpha = 0.5);

}  // namespace fogo

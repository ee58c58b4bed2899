// Codebook flush on the device (docs/algorithm.md "After all parameters of group g have stepped";
// paper Appendix "Details of Online Directional Memory"). One block per centroid j: C is small
// (tens to hundreds), each block does O(C d + r C) work, and the whole flush is two kernels and one
// GEMM (corr = chat cbar^T, ops_cuda.cpp) instead of a dozen small ATen ops.
#include <cstdint>

#include "fogo_private/cuda/kernels.h"
#include "reduce.cuh"

namespace fogo::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    flush_ema_kernel(float* __restrict__ S, float* __restrict__ N, const float* __restrict__ s,
                     const float* __restrict__ m, int64_t d, float beta, float one_minus_beta,
                     float eps, float* __restrict__ chat) {
  __shared__ float scratch[32];
  const int64_t j = blockIdx.x;
  const float n_new = beta * N[j] + one_minus_beta * m[j];
  const float den = n_new + eps;  // ctilde_j = S_j / (N_j + eps)
  float* Sj = S + j * d;
  const float* sj = s + j * d;
  float* out = chat + j * d;
  float sq = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    const float v = beta * Sj[k] + one_minus_beta * sj[k];
    Sj[k] = v;
    const float ct = v / den;
    out[k] = ct;
    sq += ct * ct;
  }
  const float norm = sqrtf(block_sum(sq, scratch));  // its barriers order N[j]'s reads before
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) out[k] = out[k] / (norm + eps);
  if (threadIdx.x == 0) N[j] = n_new;
}

struct Candidate {
  float value;  // |corr_jl|
  int64_t index;
};

// The order of R_j's selection: larger |corr| first, ties to the lower index (a strict total
// order on distinct indices, so the r picks are found one after another with no per-entry flags).
__device__ __forceinline__ bool precedes(Candidate a, Candidate b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ Candidate block_best(Candidate c, float* values, int64_t* indices) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const auto merge = [](Candidate x) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const Candidate other{__shfl_xor_sync(kFullMask, x.value, offset),
                            __shfl_xor_sync(kFullMask, x.index, offset)};
      if (precedes(other, x)) x = other;
    }
    return x;
  };
  c = merge(c);
  __syncthreads();  // the previous round's readers are done with the scratch
  if (lane == 0) {
    values[warp] = c.value;
    indices[warp] = c.index;
  }
  __syncthreads();
  c = lane < warps ? Candidate{values[lane], indices[lane]} : Candidate{-1.f, INT64_MAX};
  return merge(c);
}

__global__ void __launch_bounds__(kThreads)
    flush_decorrelate_kernel(const float* __restrict__ S, const float* __restrict__ N,
                             const float* __restrict__ corr, const float* __restrict__ prev,
                             int64_t C, int64_t d, int64_t r, float lambda_c, float eps,
                             float* __restrict__ out) {
  __shared__ float values[32], scratch[32];
  __shared__ int64_t indices[32];
  const int64_t j = blockIdx.x;
  float* oj = out + j * d;  // accumulates h_j, then holds raw_j, then c_j
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) oj[k] = 0.f;

  // h_j = sum over R_j of <chat_j, cbar_l> cbar_l, R_j picked in order of |corr_jl|.
  const float* cj = r > 0 ? corr + j * C : nullptr;  // corr is null when r = 0
  Candidate last{INFINITY, -1};
  for (int64_t t = 0; t < r; ++t) {
    Candidate best{-1.f, INT64_MAX};  // below every |corr|
    for (int64_t l = threadIdx.x; l < C; l += blockDim.x) {
      const Candidate c{fabsf(cj[l]), l};
      if (l != j && precedes(last, c) && precedes(c, best)) best = c;
    }
    last = block_best(best, values, indices);
    if (last.index >= C) break;  // no candidate left: only with NaN correlations (uniform)
    const float w = cj[last.index];
    const float* pl = prev + last.index * d;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) oj[k] += w * pl[k];
  }

  // c_j = unit(ctilde_j - lambda_c h_j), or the previous direction for an idle centroid or a
  // vanishing new direction.
  const float den = N[j] + eps;
  const float* Sj = S + j * d;
  float sq = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    const float raw = Sj[k] / den - lambda_c * oj[k];
    oj[k] = raw;
    sq += raw * raw;
  }
  const float norm = sqrtf(block_sum(sq, scratch));
  const bool keep = N[j] <= eps || norm <= eps;
  const float* pj = prev + j * d;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) oj[k] = keep ? pj[k] : oj[k] / (norm + eps);
}

}  // namespace

void launch_flush_ema(float* S, float* N, const float* s, const float* m, int64_t C, int64_t d,
                      double beta, float eps, float* chat, cudaStream_t stream) {
  if (C == 0) return;  // no centroid: nothing to do (a zero-block grid is a launch error)
  // 1 - beta formed in double and rounded once, as the reference's scalar is.
  flush_ema_kernel<<<static_cast<unsigned>(C), kThreads, 0, stream>>>(
      S, N, s, m, d, static_cast<float>(beta), static_cast<float>(1.0 - beta), eps, chat);
}

void launch_flush_decorrelate(const float* S, const float* N, const float* corr, const float* prev,
                              int64_t C, int64_t d, int64_t r, float lambda_c, float eps,
                              float* out, cudaStream_t stream) {
  if (C == 0) return;
  flush_decorrelate_kernel<<<static_cast<unsigned>(C), kThreads, 0, stream>>>(
      S, N, corr, prev, C, d, r, lambda_c, eps, out);
}

}  // namespace fogo::cuda

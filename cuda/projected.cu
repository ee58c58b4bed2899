// Row-wise kernels of the projected step (docs/algorithm.md steps 4-7; paper Appendix "Details of
// Slow-Fast Fusion", "Details of Online Directional Memory", "Details of Long-Term Near-Orthogonal
// Protection"). One warp per row i: every quantity here is a per-row reduction over d (or C, K)
// followed by elementwise work on the same row, so a warp keeps the row's partial sums in
// registers and touches each row of HBM data a small, fixed number of times. The similarities
// (R x C x d) and the long-term contractions (R x K x d) between these kernels are cuBLAS GEMMs
// (ops_cuda.cpp); the short-term components read only the few centroids each row's sets hold.
#include <cfloat>
#include <cmath>

#include "fogo_private/cuda/kernels.h"
#include "reduce.cuh"

namespace fogo::cuda {
namespace {

constexpr int kThreads = kRowsPerBlock * 32;

// Sums `flags` (one per warp of the block) in warp order into partial[blockIdx.x].
__device__ void store_block_count(float flag, float* shared, float* partial) {
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = flag;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kRowsPerBlock; ++w) total += shared[w];
    partial[blockIdx.x] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    fuse_rows_kernel(const float* __restrict__ Ps, const float* __restrict__ Pf, int64_t R,
                     int64_t d, float xi, float eps, float clamp_lo, float clamp_hi,
                     bool subtract_ps, float* __restrict__ z_out, float* __restrict__ q,
                     float* __restrict__ znorm, bool* __restrict__ valid) {
  const int64_t i = warp_row(kRowsPerBlock);
  if (i >= R) return;  // warp-uniform; no block barrier below
  const int lane = threadIdx.x % 32;
  const float* s = Ps + i * d;
  const float* f = Pf + i * d;

  // |P_s,i|, |P_f,i|, then the normalised rows ps, pf and a = <pf, ps>. Each pass re-reads the
  // row from L1; the reference normalises first and then takes the dot product, as done here.
  float ss = 0.f, ff = 0.f;
  for (int64_t k = lane; k < d; k += 32) {
    ss += s[k] * s[k];
    ff += f[k] * f[k];
  }
  const float norm_s = sqrtf(warp_sum(ss)), norm_f = sqrtf(warp_sum(ff));
  const float den_s = norm_s + eps, den_f = norm_f + eps;
  float a = 0.f;
  for (int64_t k = lane; k < d; k += 32) a += (f[k] / den_f) * (s[k] / den_s);
  a = warp_sum(a);

  // theta = acos(clip(a)), v = unit(pf - a ps), z' = cos(xi theta) ps + sin(xi theta) v.
  const float theta = acosf(fminf(fmaxf(a, clamp_lo), clamp_hi));
  const float c = cosf(xi * theta), sn = sinf(xi * theta);
  float ww = 0.f;
  for (int64_t k = lane; k < d; k += 32) {
    const float w = f[k] / den_f - a * (s[k] / den_s);
    ww += w * w;
  }
  const float den_w = sqrtf(warp_sum(ww)) + eps;
  const auto z_at = [&](int64_t k) {
    const float ps = s[k] / den_s;
    const float v = (f[k] / den_f - a * ps) / den_w;
    return norm_s * (c * ps + sn * v);  // z_i = |P_s,i| z'_i: the slow stream sets the scale
  };
  float zz = 0.f;
  for (int64_t k = lane; k < d; k += 32) {
    const float zk = z_at(k);
    zz += zk * zk;
  }
  const float norm_z = sqrtf(warp_sum(zz));
  const float den_z = norm_z + eps;
  float* out = z_out + i * d;
  float* qi = q + i * d;
  for (int64_t k = lane; k < d; k += 32) {
    const float zk = z_at(k);
    qi[k] = zk / den_z;
    out[k] = subtract_ps ? zk - s[k] : zk;
  }
  if (lane == 0) {
    znorm[i] = norm_z;
    valid[i] = norm_z > 0.f;
  }
}

// Columns of the [z_hi; z_conf] row each lane accumulates per pass over the sets: 32 lanes x
// kGatherCols covers d <= 512 (the paper's largest projection) in one pass.
constexpr int kGatherCols = 16;

// Long on purpose (~120 lines): steps 5 and 6 for one row in one pass (the assignment, the
// statistics, both angular-band sets and the conflict ratio), so that the row's similarities and
// its z stay in registers and shared memory instead of making several trips through global memory.
__global__ void __launch_bounds__(kThreads)
    memory_read_kernel(const float* __restrict__ sim, const float* __restrict__ q,
                       const float* __restrict__ znorm, const bool* __restrict__ valid, int64_t R,
                       int64_t C, int64_t d, ShortTermArgs args, float* __restrict__ m,
                       float* __restrict__ s, const float* __restrict__ cbar,
                       float* __restrict__ zhc, float* __restrict__ conflict_partial,
                       float* __restrict__ over_partial, float* __restrict__ r_partial,
                       float* __restrict__ valid_partial) {
  __shared__ float conflict_flags[kRowsPerBlock], over_flags[kRowsPerBlock], ratios[kRowsPerBlock],
      valid_flags[kRowsPerBlock];
  const int64_t i = warp_row(kRowsPerBlock);
  const int lane = threadIdx.x % 32;
  bool any_conflict = false, any_over = false;
  float r = 0.f;
  if (i < R) {
    const float* row = sim + i * C;
    // a_i = argmax_j s_ij, the first maximal index as torch.argmax: each lane scans its columns
    // in increasing order keeping strict improvements, then lanes merge preferring lower j.
    float best = -INFINITY;
    int64_t arg = INT64_MAX;
    for (int64_t j = lane; j < C; j += 32) {
      if (row[j] > best) {
        best = row[j];
        arg = j;
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int64_t other_arg = __shfl_xor_sync(kFullMask, arg, offset);
      if (other > best || (other == best && other_arg < arg)) {
        best = other;
        arg = other_arg;
      }
    }
    // m_j += 1[a_i = j], s_j += 1[a_i = j] q_i over valid rows (zero queries carry no direction).
    // arg == INT64_MAX only for an all-NaN row, which must not write out of bounds.
    if (valid[i] && arg < C) {
      if (lane == 0) atomicAdd(m + arg, 1.f);
      const float* qi = q + i * d;
      float* sj = s + arg * d;
      for (int64_t k = lane; k < d; k += 32) atomicAdd(sj + k, qi[k]);
    }

    if (zhc != nullptr) {
      // Softmax over H_i of tau_plus s_ij and over C_i of tau_minus |s_ij|, shifted by the set's
      // maximum logit; empty sets give zero weights.
      float max_over = -INFINITY, max_conf = -INFINITY;
      int n_over = 0, n_conf = 0;
      for (int64_t j = lane; j < C; j += 32) {
        const float v = row[j];
        if (v > args.eps_st) {
          max_over = fmaxf(max_over, args.tau_plus * v);
          ++n_over;
        }
        if (v < -args.eps_st) {  // not `else`: the sets are tested independently, as in ATen
          max_conf = fmaxf(max_conf, args.tau_minus * fabsf(v));
          ++n_conf;
        }
      }
      max_over = warp_max(max_over);
      max_conf = warp_max(max_conf);
      any_over = warp_sum(n_over) > 0;
      any_conflict = warp_sum(n_conf) > 0;
      float sum_over = 0.f, sum_conf = 0.f;
      for (int64_t j = lane; j < C; j += 32) {
        const float v = row[j];
        if (v > args.eps_st) sum_over += expf(args.tau_plus * v - max_over);
        if (v < -args.eps_st) sum_conf += expf(args.tau_minus * fabsf(v) - max_conf);
      }
      sum_over = warp_sum(sum_over);
      sum_conf = warp_sum(sum_conf);
      // z_hi_i = sum_{H_i} w+_ij cbar_j and z_conf_i = sum_{C_i} w-_ij cbar_j, with
      // w_ij = alpha_ij <z_i, cbar_j> and <z_i, cbar_j> = (|z_i| + eps) s_ij (z_i = (|z_i| + eps)
      // q_i). The sets are a small part of the codebook, so only their centroids are read: each
      // lane weighs one centroid of every 32, a ballot names the members, and the warp adds
      // their rows, in increasing j.
      const float scale = znorm[i] + args.eps;
      float hh = 0.f, cc = 0.f;
      for (int64_t k0 = 0; k0 < d; k0 += 32 * kGatherCols) {
        float hi[kGatherCols] = {}, conf[kGatherCols] = {};
        for (int64_t j0 = 0; j0 < C; j0 += 32) {
          const int64_t j = j0 + lane;
          const float v = j < C ? row[j] : 0.f;
          const bool over = j < C && v > args.eps_st, con = j < C && v < -args.eps_st;
          const float w_over =
              over ? expf(args.tau_plus * v - max_over) / sum_over * (scale * v) : 0.f;
          const float w_conf =
              con ? expf(args.tau_minus * fabsf(v) - max_conf) / sum_conf * (scale * v) : 0.f;
          for (unsigned members = __ballot_sync(kFullMask, over || con); members != 0;
               members &= members - 1) {
            const int b = __ffs(members) - 1;
            const float wo = __shfl_sync(kFullMask, w_over, b);
            const float wc = __shfl_sync(kFullMask, w_conf, b);
            const float* c = cbar + (j0 + b) * d;
#pragma unroll
            for (int t = 0; t < kGatherCols; ++t) {
              const int64_t k = k0 + lane + 32 * t;
              if (k < d) {
                const float ck = c[k];
                hi[t] += wo * ck;
                conf[t] += wc * ck;
              }
            }
          }
        }
#pragma unroll
        for (int t = 0; t < kGatherCols; ++t) {
          const int64_t k = k0 + lane + 32 * t;
          if (k < d) {
            zhc[i * d + k] = hi[t];
            zhc[(R + i) * d + k] = conf[t];
            hh += hi[t] * hi[t];
            cc += conf[t] * conf[t];
          }
        }
      }
      // r_i = (|z_conf_i| + lambda_hi |z_hi_i|) / (|z_i| + eps)   (step 6's conflict ratio)
      r = (sqrtf(warp_sum(cc)) + args.lambda_hi * sqrtf(warp_sum(hh))) / scale;
    }
  }
  if (zhc != nullptr) {  // uniform over the launch
    store_block_count(any_conflict ? 1.f : 0.f, conflict_flags, conflict_partial);
    store_block_count(any_over ? 1.f : 0.f, over_flags, over_partial);
    store_block_count(r, ratios, r_partial);
    // The rows that are not zero queries: r_t and the fractions are means over them.
    store_block_count(i < R && valid[i] ? 1.f : 0.f, valid_flags, valid_partial);
  }
}

// The host cannot know r_t without a synchronisation, so the EMA and gamma_st are computed here,
// on the device, between the two halves of step 6.
__global__ void __launch_bounds__(1024)
    short_term_reduce_kernel(const float* __restrict__ r_partial,
                             const float* __restrict__ conflict_partial,
                             const float* __restrict__ over_partial,
                             const float* __restrict__ valid_partial, int64_t blocks,
                             const float* __restrict__ rbar, AdaptiveArgs args,
                             float* __restrict__ rbar_out, float* __restrict__ stats) {
  __shared__ float scratch[32];
  float r = 0.f, conflict = 0.f, over = 0.f, valid = 0.f;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    r += r_partial[b];
    conflict += conflict_partial[b];
    over += over_partial[b];
    valid += valid_partial[b];
  }
  r = block_sum(r, scratch);
  conflict = block_sum(conflict, scratch);
  over = block_sum(over, scratch);
  valid = block_sum(valid, scratch);
  if (threadIdx.x == 0) {
    // Means over the rows that are not zero queries (a zero row has r_i = 0 and no set); 0
    // when there are none (docs/algorithm.md, Clarifications).
    const float rows = fmaxf(valid, 1.f);
    const float r_t = r / rows;
    const float rbar_new = args.beta_r * rbar[0] + args.one_minus_beta_r * r_t;
    rbar_out[0] = rbar_new;
    stats[0] = args.gamma_st_min +
               (args.gamma_st_max - args.gamma_st_min) * rbar_new / (rbar_new + args.kappa);
    stats[1] = conflict / rows;
    stats[2] = over / rows;
  }
}

__global__ void __launch_bounds__(kThreads)
    short_term_apply_kernel(const float* z, const float* __restrict__ zhc,
                            const float* __restrict__ Ps, const float* __restrict__ stats,
                            int64_t R, int64_t d, float gamma_hi, float* __restrict__ dz,
                            float* ztilde, float* __restrict__ ztnorm) {
  const int64_t i = warp_row(kRowsPerBlock);
  if (i >= R) return;  // warp-uniform; no block barrier below
  const int lane = threadIdx.x % 32;
  const float gamma_st = stats[0];
  const float* zi = z + i * d;
  const float* hi = zhc + i * d;
  const float* conf = zhc + (R + i) * d;
  const float* si = Ps + i * d;
  float* dzi = dz + i * d;
  float tt = 0.f;
  for (int64_t k = lane; k < d; k += 32) {
    const float zt = zi[k] - gamma_hi * hi[k] - gamma_st * conf[k];  // z~_i
    dzi[k] = zt - si[k];
    if (ztilde != nullptr) {
      ztilde[i * d + k] = zt;  // may alias z: each element is read before it is written
      tt += zt * zt;
    }
  }
  if (ztilde != nullptr) {
    tt = warp_sum(tt);
    if (lane == 0) ztnorm[i] = sqrtf(tt);
  }
}

__global__ void __launch_bounds__(kThreads)
    long_term_weights_kernel(const float* __restrict__ F, const float* __restrict__ ztnorm,
                             const float* __restrict__ nu, int64_t R, int64_t K, LongTermArgs args,
                             float* __restrict__ Wlt, float* __restrict__ protected_partial) {
  __shared__ float flags[kRowsPerBlock];
  const int64_t i = warp_row(kRowsPerBlock);
  const int lane = threadIdx.x % 32;
  bool any = false;
  if (i < R) {
    const float* row = F + i * K;
    const float den = ztnorm[i] + args.eps;  // <q~_i, c_k> = <z~_i, c_k> / (|z~_i| + eps)
    float trace = 0.f;
    int active = 0;
    for (int64_t k = lane; k < K; k += 32) {
      if (fabsf(row[k] / den) > args.eps_lt) {
        trace += nu[k];
        ++active;
      }
    }
    trace = warp_sum(trace);
    any = warp_sum(active) > 0;
    // lambda_max(Omega_i) <= trace(Omega_i) = sum_{B_i} nu_k (unit c_k): Theorem 4's bound.
    const float gamma = args.spectral_scaling
                            ? args.gamma_lt * fminf(1.f / fmaxf(trace, FLT_MIN), 1.f)
                            : args.gamma_lt;
    float* out = Wlt + i * K;
    for (int64_t k = lane; k < K; k += 32)
      out[k] = fabsf(row[k] / den) > args.eps_lt ? gamma * nu[k] * row[k] : 0.f;
  }
  store_block_count(any ? 1.f : 0.f, flags, protected_partial);
}

__global__ void __launch_bounds__(1024)
    protected_reduce_kernel(const float* __restrict__ protected_partial,
                            const float* __restrict__ valid_partial, int64_t blocks,
                            float* __restrict__ stats) {
  __shared__ float scratch[32];
  float total = 0.f, valid = 0.f;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    total += protected_partial[b];
    valid += valid_partial[b];
  }
  total = block_sum(total, scratch);
  valid = block_sum(valid, scratch);
  // A zero query's z~ is zero: never protected; the fraction is over the valid rows.
  if (threadIdx.x == 0) stats[3] = total / fmaxf(valid, 1.f);
}

unsigned grid_for(int64_t R) { return static_cast<unsigned>(row_blocks(R)); }

}  // namespace

void launch_fuse_rows(const float* Ps, const float* Pf, int64_t R, int64_t d, float xi, float eps,
                      float clamp_lo, float clamp_hi, bool subtract_ps, float* z, float* q,
                      float* znorm, bool* valid, cudaStream_t stream) {
  fuse_rows_kernel<<<grid_for(R), kThreads, 0, stream>>>(Ps, Pf, R, d, xi, eps, clamp_lo, clamp_hi,
                                                         subtract_ps, z, q, znorm, valid);
}

void launch_memory_read(const float* sim, const float* q, const float* znorm, const bool* valid,
                        int64_t R, int64_t C, int64_t d, ShortTermArgs args, float* m, float* s,
                        const float* cbar, float* zhc, float* conflict_partial, float* over_partial,
                        float* r_partial, float* valid_partial, cudaStream_t stream) {
  memory_read_kernel<<<grid_for(R), kThreads, 0, stream>>>(sim, q, znorm, valid, R, C, d, args, m,
                                                           s, cbar, zhc, conflict_partial,
                                                           over_partial, r_partial, valid_partial);
}

void launch_short_term_reduce(const float* r_partial, const float* conflict_partial,
                              const float* over_partial, const float* valid_partial, int64_t blocks,
                              const float* rbar, AdaptiveArgs args, float* rbar_out, float* stats,
                              cudaStream_t stream) {
  short_term_reduce_kernel<<<1, 1024, 0, stream>>>(r_partial, conflict_partial, over_partial,
                                                   valid_partial, blocks, rbar, args, rbar_out,
                                                   stats);
}

void launch_short_term_apply(const float* z, const float* zhc, const float* Ps, const float* stats,
                             int64_t R, int64_t d, float gamma_hi, float* dz, float* ztilde,
                             float* ztnorm, cudaStream_t stream) {
  short_term_apply_kernel<<<grid_for(R), kThreads, 0, stream>>>(z, zhc, Ps, stats, R, d, gamma_hi,
                                                                dz, ztilde, ztnorm);
}

void launch_long_term_weights(const float* F, const float* ztnorm, const float* nu, int64_t R,
                              int64_t K, LongTermArgs args, float* Wlt, float* protected_partial,
                              cudaStream_t stream) {
  long_term_weights_kernel<<<grid_for(R), kThreads, 0, stream>>>(F, ztnorm, nu, R, K, args, Wlt,
                                                                 protected_partial);
}

void launch_protected_reduce(const float* protected_partial, const float* valid_partial,
                             int64_t blocks, float* stats, cudaStream_t stream) {
  protected_reduce_kernel<<<1, 1024, 0, stream>>>(protected_partial, valid_partial, blocks, stats);
}

}  // namespace fogo::cuda

#pragma once
// fogo's CUDA kernels, as plain launchers over raw device pointers (no ATen here, so the .cu files
// compile quickly). Every launcher enqueues on `stream` and never synchronises with the host.
// ops_cuda.cpp allocates the tensors, runs the GEMMs through ATen and calls these in order.
//
// Symbols follow the paper / docs/algorithm.md: rows i of a codebook group (R rows, projected dim
// d), centroids j (C of them), frozen centroids k (K of them).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fogo::cuda {

/// Rows handled by one block of the row-wise kernels (one warp per row); per-block partial
/// sums are indexed by blockIdx.x, so callers size them with row_blocks(R).
constexpr int kRowsPerBlock = 8;
inline int64_t row_blocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

// ---------------------------------------------------------------------------------------------
// Projected step (docs/algorithm.md steps 4-7). All [R, d] arrays are fp32, row-major, contiguous.

/// Step 4 and the query of step 5: z_i = |Ps_i| Slerp(Ps_i, Pf_i; xi), q_i = z_i/(|z_i|+eps),
/// znorm_i = |z_i|, valid_i = |z_i| > 0. Writes z - Ps instead of z when `subtract_ps` (a
/// group's first step, where dz = z - Ps is the whole answer). `clamp_lo/hi` bound the cosine
/// before acos (-1+eps, 1-eps, rounded to fp32 as the reference does).
void launch_fuse_rows(const float* Ps, const float* Pf, int64_t R, int64_t d, float xi, float eps,
                      float clamp_lo, float clamp_hi, bool subtract_ps, float* z, float* q,
                      float* znorm, bool* valid, cudaStream_t stream);

struct ShortTermArgs {
  float eps_st, tau_plus, tau_minus, eps, lambda_hi;
};

/// Step 5's memory read and step 6's components, from sim = q cbar^T [R, C]:
/// a_i = argmax_j sim_ij; for valid rows m[a_i] += 1 and s[a_i] += q_i (atomics; m, s zeroed by
/// the caller). When `zhc` is non-null (filtering; cbar [C, d] then too), also
///   zhc[i]     = z_hi_i   = sum_{H_i} alpha+_ij <z_i, cbar_j> cbar_j,  H_i = {sim_ij > eps_st},
///   zhc[R + i] = z_conf_i = sum_{C_i} alpha-_ij <z_i, cbar_j> cbar_j,  C_i = {sim_ij < -eps_st},
/// (zhc [2R, d]) alpha the softmax of tau_plus sim (tau_minus |sim|) over the set, with
/// <z_i, cbar_j> = (|z_i| + eps) sim_ij (z_i = (|z_i| + eps) q_i), reading only the sets'
/// centroids; and per block, into [row_blocks(R)] arrays: the number of rows with non-empty
/// C_i / H_i (conflict_partial / over_partial), the sum of the conflict ratios
/// r_i = (|z_conf_i| + lambda_hi |z_hi_i|) / (|z_i| + eps) (r_partial) and the number of valid
/// rows, those that are not zero queries (valid_partial).
void launch_memory_read(const float* sim, const float* q, const float* znorm, const bool* valid,
                        int64_t R, int64_t C, int64_t d, ShortTermArgs args, float* m, float* s,
                        const float* cbar, float* zhc, float* conflict_partial, float* over_partial,
                        float* r_partial, float* valid_partial, cudaStream_t stream);

struct AdaptiveArgs {
  float beta_r, one_minus_beta_r, gamma_st_min, gamma_st_max, kappa;  // 1 - beta_r rounded once
};

/// One block, with V = max(1, number of valid rows) (zero queries take no part; docs/algorithm.md,
/// Clarifications): r_t = sum(r_partial)/V, rbar_out = beta_r rbar + (1-beta_r) r_t,
/// gamma_st = gmin + (gmax-gmin) rbar_out/(rbar_out+kappa); stats[0] = gamma_st,
/// stats[1] = #conflicting rows/V, stats[2] = #over-aligned rows/V. Sums in a fixed order.
void launch_short_term_reduce(const float* r_partial, const float* conflict_partial,
                              const float* over_partial, const float* valid_partial, int64_t blocks,
                              const float* rbar, AdaptiveArgs args, float* rbar_out, float* stats,
                              cudaStream_t stream);

/// Step 6's correction with gamma_st = stats[0]: z~_i = z_i - gamma_hi z_hi_i - gamma_st z_conf_i,
/// dz_i = z~_i - Ps_i. With `ztilde` non-null (long-term protection follows) also writes z~
/// (may alias z) and its row norms.
void launch_short_term_apply(const float* z, const float* zhc, const float* Ps, const float* stats,
                             int64_t R, int64_t d, float gamma_hi, float* dz, float* ztilde,
                             float* ztnorm, cudaStream_t stream);

struct LongTermArgs {
  float eps_lt, gamma_lt, eps;
  bool spectral_scaling;
};

/// Step 7's coefficients from F = z~ frozen^T [R, K]: B_i = {k : |F_ik|/(|z~_i|+eps) > eps_lt},
/// gamma_lt_i = gamma_lt min(1, 1/sum_{B_i} nu_k) with spectral scaling (else gamma_lt), and
/// Wlt_ik = gamma_lt_i nu_k F_ik on B_i, 0 elsewhere, so that zbar = z~ - Wlt frozen. Rows with
/// non-empty B_i are counted per block in protected_partial [row_blocks(R)].
void launch_long_term_weights(const float* F, const float* ztnorm, const float* nu, int64_t R,
                              int64_t K, LongTermArgs args, float* Wlt, float* protected_partial,
                              cudaStream_t stream);

/// One block: stats[3] = sum(protected_partial)/V, V = max(1, number of valid rows).
void launch_protected_reduce(const float* protected_partial, const float* valid_partial,
                             int64_t blocks, float* stats, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Codebook flush ("After all parameters of group g have stepped"). [C, d] fp32 contiguous.

/// One block per centroid: S_j = beta S_j + (1-beta) s_j, N_j = beta N_j + (1-beta) m_j (in
/// place), chat_j = unit(S_j/(N_j+eps)).
void launch_flush_ema(float* S, float* N, const float* s, const float* m, int64_t C, int64_t d,
                      double beta, float eps, float* chat, cudaStream_t stream);

/// One block per centroid: R_j = the r entries l != j of corr = chat prev^T [C, C] with the
/// largest |corr_jl| (ties to the lower index; r = 0: none, corr unused),
/// h_j = sum_{R_j} corr_jl prev_l, raw_j = S_j/(N_j+eps) - lambda_c h_j,
/// out_j = prev_j if N_j <= eps or |raw_j| <= eps, else raw_j/(|raw_j|+eps).
void launch_flush_decorrelate(const float* S, const float* N, const float* corr, const float* prev,
                              int64_t C, int64_t d, int64_t r, float lambda_c, float eps,
                              float* out, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// RMS-scaled update (step 9). Os and delta: [m, n] contiguous, the working orientation; delta
// fp32, Os fp32 or the Newton–Schulz compute dtype (bf16/fp16), read as is (no fp32 copy).

/// Element type of a parameter or of O_s.
enum class FloatType { Float, BFloat16, Half };

struct UpdateArgs {
  double lr, weight_decay, sigma, eps;
  const double* device_lr;  ///< when not null, the learning rate (read by the kernel) instead of lr
  const bool* ok;           ///< when not null and false, no parameter changes (Mask)
};

/// Parameters per launch of the RMS update: their table travels as a kernel argument (under the
/// 4 KiB limit), so a group of up to this many parameters of one dtype is three launches.
constexpr int kRmsChunk = 32;

/// One parameter of an RMS-update launch. The parameter is [m, n] row-major, or [n, m] holding
/// Ohat^T when `transposed`; Os and delta [m, n] row-major.
struct RmsTensor {
  void* param;
  const void* Os;
  const float* delta;
  int64_t m, n;
  bool transposed;
};

struct RmsChunk {
  RmsTensor t[kRmsChunk];
  int count;
};

/// Doubles of scratch launch_rms_update needs for a chunk.
int64_t rms_scratch_doubles(const RmsChunk& chunk);

/// For every parameter of the chunk (all of `param_type`, all O_s of `os_type`):
///   theta <- (1 - lr wd) theta - lr gamma_t Ohat,  gamma_t = sigma sqrt(mn)/(|Ohat|_F + eps),
/// Ohat = Os + delta, in fp32 whatever the parameter's type (one rounding at the store), and
/// ratio[k] = |delta|_F / (|Os|_F + eps). Three launches whatever the count: the norms reduced
/// into per-block partials, one block per parameter reducing them to its step size, one pass
/// writing the parameters. Each parameter's numbers do not depend on the others in the chunk.
void launch_rms_update(const RmsChunk& chunk, FloatType param_type, FloatType os_type,
                       UpdateArgs args, double* scratch, float* ratio, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Step 1 (fogo::momenta_step), for many parameters per launch (their table is a kernel argument).

/// Parameters per launch of the momenta kernel (the table stays under the 4 KiB argument limit).
constexpr int kMomentaChunk = 40;

/// One parameter of a momenta launch: Bs, Bf, G fp32 [rows, cols] row-major (rows, cols >= 1);
/// Xs, Xf (null: not wanted) [rows, cols], or [cols, rows] when `transposed`.
struct MomentaTensor {
  float* Bs;
  float* Bf;
  const float* G;
  void* Xs;
  void* Xf;
  int64_t rows, cols;
  bool transposed;
};

struct MomentaChunk {
  MomentaTensor t[kMomentaChunk];
  int count;
};

/// For every parameter of the chunk: B = fl(fl(B mu) + G) for both streams, or, where `ok` (a
/// device bool; null: always) is false, B = fl(fl(B 1) + -0) (its bits kept). Then Xs, Xf = B in
/// x_type (every X of the chunk of that type), transposed where asked. One read of G, Bs, Bf; one
/// launch whatever the count (nothing when it is 0).
void launch_momenta(const MomentaChunk& chunk, float mu_s, float mu_f, const bool* ok,
                    FloatType x_type, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// fogo::Muon's update (muon.h, muon_update), for many parameters per launch.

/// Parameters per launch of Muon's update (the table stays under the 4 KiB argument limit).
constexpr int kMuonChunk = 48;

/// One parameter of a Muon-update launch: param [rows, cols] row-major (its matrix view), O
/// [rows, cols] row-major, or [cols, rows] holding O^T when `transposed`; the adjusted learning
/// rate is (lr f1) f2 (muon_adjusted_lr's factors, so a device lr rounds as the host's does).
struct MuonTensor {
  void* param;
  const void* O;
  int64_t rows, cols;
  double f1, f2;
  bool transposed;
};

struct MuonChunk {
  MuonTensor t[kMuonChunk];
  int count;
};

struct MuonArgs {
  double lr, weight_decay;
  const double* device_lr;  ///< when not null, the learning rate (read by the kernel) instead of lr
  const bool* ok;           ///< Mask: when not null and false, every parameter keeps every bit
};

/// For every parameter of the chunk (all of `param_type`, all O of `o_type`), as the ATen route
/// (mul_ by the decay in fp32 opmath, then add_ with alpha) rounds it:
///   p1 = fl_T(p fl32(1 - lr wd)),   p = fl_T(fma(fl32(-(lr f1) f2), O, p1)),
/// the double products rounded as the host rounds them. One launch whatever the count.
void launch_muon_update(const MuonChunk& chunk, FloatType param_type, FloatType o_type,
                        MuonArgs args, cudaStream_t stream);

}  // namespace fogo::cuda

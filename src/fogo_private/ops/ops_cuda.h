#pragma once
// The CUDA implementations behind fogo::ops (ops.h), for CUDA fp32 tensors (bf16/fp16 parameters
// in the update). src/ops/ops.cpp decides when they apply; these only check their preconditions.
// Same contracts and results as the ATen references (projected.h, codebook.h, update.h), up to
// floating-point summation order.

#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/momenta.h"
#include "fogo_private/fogo/projected.h"
#include "fogo_private/fogo/update.h"
#include "fogo_private/muon/update.h"

namespace fogo::cuda {

/// Whether the kernels were built for this CUDA device's architecture (compute capability 8.0
/// or newer: FOGO_CUDA_ARCHITECTURES builds 8.0, 8.6, 8.9 and 9.0, with 9.0 PTX for later ones).
bool runs_on(const c10::Device& device);

/// Rows R >= 1; Ps, Pf [R, d]; cbar [C, d]; frozen [K, d] and nu [K] (K may be 0 or undefined).
ProjectedStepResult projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                   const at::Tensor& cbar, const at::Tensor& frozen,
                                   const at::Tensor& nu, const at::Tensor& rbar,
                                   const ProjectedStepParams& p);

/// book.S, book.N (contiguous) and book.centroids are updated in place.
void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p);

/// Every item's Bs, Bf, G contiguous fp32 on one device; Xs, Xf contiguous fp32, bf16 or fp16 (or
/// undefined); `ok` a 0-d bool on that device or undefined.
void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok);

/// Every item's param contiguous, fp32, bf16 or fp16; O [rows, numel / rows] fp32, bf16 or fp16
/// (contiguous, or the transpose of a contiguous matrix); all on one device.
void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p);

/// Every item's param contiguous, fp32, bf16 or fp16; Os [m, n] fp32, bf16 or fp16; delta
/// [m, n] fp32; all on one device; `ok` a 0-d bool there or undefined.
std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok);

}  // namespace fogo::cuda

#pragma once
// The device-dispatched operations of FOGO's step, declared once. Each has an ATen reference
// implementation (projected.h, codebook.h, update.h) that runs on any device; on CUDA tensors,
// when fogo was built with its kernels (FOGO_WITH_CUDA), the fused kernels of cuda/ run
// instead. The choice is made here and nowhere else; kernels compute, they do not decide.

#include <fogo/codebook.h>
#include <fogo/momenta.h>
#include <fogo/projected.h>
#include <fogo/update.h>

namespace fogo::ops {

/// Whether CUDA tensors use fogo's fused kernels (false: the ATen reference everywhere).
bool cuda_kernels_available();

ProjectedStepResult projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                   const at::Tensor& cbar, const at::Tensor& frozen,
                                   const at::Tensor& nu, const at::Tensor& rbar,
                                   const ProjectedStepParams& p);

void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok);

void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p);

std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok = {});

}  // namespace fogo::ops

#pragma once
// The device-dispatched operations of FOGO's and Muon's steps, declared once. Each has an ATen
// reference of the same name in fogo::ref (projected.h, codebook.h, update.h, momenta.h,
// muon_update.h) that runs on any device (a call that forgets ops:: does not compile); on CUDA
// tensors, when fogo was built with its kernels (FOGO_WITH_CUDA), the fused kernels of cuda/ run
// instead. The choice is made here and nowhere else; kernels compute, they do not decide.

#include "fogo_private/fogo/codebook.h"
#include "fogo_private/fogo/momenta.h"
#include "fogo_private/fogo/projected.h"
#include "fogo_private/fogo/update.h"
#include "fogo_private/muon/update.h"

namespace fogo::ops {

/// Whether CUDA tensors use fogo's fused kernels (false: the ATen reference everywhere).
bool cuda_kernels_available();

/// The multi-tensor calls (momenta_step, apply_rms_update, muon_update) route item by item: the
/// items the kernels take go to them in one call, the others (a non-contiguous or fp64
/// parameter, CPU tensors) to the reference in one call, so one odd item does not send its group
/// to the slow path. How many items this thread's calls have handed to each (tests count them;
/// empty RMS-update items, answered by the dispatch, reach neither).
struct RoutedItems {
  int64_t kernel = 0, reference = 0;
};
RoutedItems routed_items();

ProjectedStepResult projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                   const at::Tensor& cbar, const at::Tensor& frozen,
                                   const at::Tensor& nu, const at::Tensor& rbar,
                                   const ProjectedStepParams& p);

void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok);

/// A codebook without centroids (C = 0) is left as it is, on every device.
void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p);

/// Items without elements (param, O_s and delta all empty) change nothing and get a ratio of 0
/// (|delta| / (|O_s| + eps)), on every device, without reaching an implementation.

std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok = {});

/// fogo::Muon's update (muon.h): the ATen reference, or on CUDA one multi-tensor kernel per
/// (parameter, O) dtype pair computing the same roundings.
void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p);

}  // namespace fogo::ops

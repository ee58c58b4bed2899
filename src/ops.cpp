#include "fogo/ops.h"

namespace fogo::ops {

bool cuda_kernels_available() {
#ifdef FOGO_WITH_CUDA
  return true;
#else
  return false;
#endif
}

ProjectedStepResult projected_step(const at::Tensor& Ps, const at::Tensor& Pf,
                                   const at::Tensor& cbar, const at::Tensor& frozen,
                                   const at::Tensor& nu, const at::Tensor& rbar,
                                   const ProjectedStepParams& p) {
  return fogo::projected_step(Ps, Pf, cbar, frozen, nu, rbar, p);
}

void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p) {
  fogo::flush(book, acc, p);
}

at::Tensor apply_rms_update(at::Tensor& param, const at::Tensor& Os, const at::Tensor& delta,
                            bool transposed, const UpdateParams& p) {
  return fogo::apply_rms_update(param, Os, delta, transposed, p);
}

}  // namespace fogo::ops

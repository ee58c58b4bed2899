#include "fogo/ops.h"

#include <algorithm>

#ifdef FOGO_WITH_CUDA
#include <initializer_list>

#include "ops_cuda.h"
#endif

namespace fogo::ops {

#ifdef FOGO_WITH_CUDA
namespace {

// The fused kernels are written for fp32 state on a CUDA device they were built for; anything
// else (CPU tensors, double precision in tests, pre-Ampere GPUs) takes the ATen reference.
bool cuda_f32(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (!t->is_cuda() || t->scalar_type() != at::kFloat || !cuda::runs_on(t->device()))
      return false;
  }
  return true;
}

// A parameter or an update input the kernels can read or store: fp32, bf16 or fp16 on a CUDA
// device they were built for.
bool storable(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return t.is_cuda() && (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf) &&
         cuda::runs_on(t.device());
}

}  // namespace
#endif

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
#ifdef FOGO_WITH_CUDA
  const bool protect = frozen.defined() && frozen.size(0) > 0;
  if (Ps.size(0) > 0 && cuda_f32({&Ps, &Pf, &cbar, &rbar}) &&
      (!protect || cuda_f32({&frozen, &nu})))
    return cuda::projected_step(Ps, Pf, cbar, frozen, nu, rbar, p);
#endif
  return fogo::ref::projected_step(Ps, Pf, cbar, frozen, nu, rbar, p);
}

void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok) {
#ifdef FOGO_WITH_CUDA
  // The fused kernel for contiguous fp32 state and fp32/bf16/fp16 inputs (fp64 NS: the
  // reference).
  const auto fused = [](const MomentaItem& item) {
    const auto input = [](const at::Tensor& x) {
      const auto type = x.scalar_type();
      return !x.defined() || (x.is_contiguous() &&
                              (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf));
    };
    return cuda_f32({&item.Bs, &item.Bf, &item.G}) && item.Bs.is_contiguous() &&
           item.Bf.is_contiguous() && item.G.is_contiguous() && input(item.Xs) && input(item.Xf);
  };
  if (!items.empty() && std::all_of(items.begin(), items.end(), fused))
    return cuda::momenta_step(items, mu_s, mu_f, ok);
#endif
  fogo::ref::momenta_step(items, mu_s, mu_f, ok);
}

void codebook_flush(Codebook& book, const Assignments& acc, const FlushParams& p) {
  // No centroid: nothing to update (the CUDA kernels would get a grid of zero blocks).
  if (book.centroids.numel() == 0 && book.S.numel() == 0 && book.N.numel() == 0 &&
      acc.m.numel() == 0 && acc.s.numel() == 0)
    return;
#ifdef FOGO_WITH_CUDA
  if (cuda_f32({&book.centroids, &book.S, &book.N, &acc.m, &acc.s}) && book.S.is_contiguous() &&
      book.N.is_contiguous())
    return cuda::codebook_flush(book, acc, p);
#endif
  fogo::ref::codebook_flush(book, acc, p);
}

std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& all,
                                         const UpdateParams& p, const at::Tensor& ok) {
  // Items without elements change nothing and their ratio is 0 / (0 + eps): they are answered
  // here (a call of only such items would give the CUDA kernels a grid of zero blocks).
  const auto empty = [](const RmsUpdateItem& item) {
    return item.param.numel() == 0 && item.Os.numel() == 0 && item.delta.numel() == 0;
  };
  if (std::any_of(all.begin(), all.end(), empty)) {
    std::vector<RmsUpdateItem> rest;
    for (const RmsUpdateItem& item : all) {
      if (!empty(item)) rest.push_back(item);
    }
    const std::vector<at::Tensor> got = ops::apply_rms_update(rest, p, ok);
    std::vector<at::Tensor> out;
    auto next = got.begin();
    for (const RmsUpdateItem& item : all) {
      out.push_back(empty(item) ? at::zeros({}, item.delta.options()) : *next++);
    }
    return out;
  }
  const std::vector<RmsUpdateItem>& items = all;
#ifdef FOGO_WITH_CUDA
  const auto fused = [](const RmsUpdateItem& item) {
    return item.param.is_contiguous() && storable(item.param) && storable(item.Os) &&
           cuda_f32({&item.delta});
  };
  if (!items.empty() && std::all_of(items.begin(), items.end(), fused))
    return cuda::apply_rms_update(items, p, ok);
#endif
  return fogo::ref::apply_rms_update(items, p, ok);
}

void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p) {
#ifdef FOGO_WITH_CUDA
  const auto fused = [](const MuonUpdateItem& item) {
    return item.param.is_contiguous() && item.param.dim() >= 1 && storable(item.param) &&
           storable(item.O) && item.O.dim() == 2;
  };
  if (!items.empty() && std::all_of(items.begin(), items.end(), fused))
    return cuda::muon_update(items, p);
#endif
  fogo::ref::muon_update(items, p);
}

}  // namespace fogo::ops

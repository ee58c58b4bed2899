#include "fogo_private/ops/ops.h"

#include "fogo_private/ops/routing.h"

#ifdef FOGO_WITH_CUDA
#include <initializer_list>

#include "fogo_private/ops/ops_cuda.h"
#endif

namespace fogo::ops {

namespace {

thread_local RoutedItems routed;

void note(size_t kernel, size_t reference) {
  routed.kernel += static_cast<int64_t>(kernel);
  routed.reference += static_cast<int64_t>(reference);
}

// Counts a call's items per implementation (the kernel takes `taken`), and passes the split on.
template <class Item>
detail::Split<Item> count(detail::Split<Item> parts) {
  note(parts.taken.size(), parts.rest.size());
  return parts;
}

}  // namespace

RoutedItems routed_items() { return routed; }

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
  const auto parts = count(detail::split(items, fused));
  cuda::momenta_step(parts.taken, mu_s, mu_f, ok);
  fogo::ref::momenta_step(parts.rest, mu_s, mu_f, ok);
#else
  note(0, items.size());
  fogo::ref::momenta_step(items, mu_s, mu_f, ok);
#endif
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

std::vector<at::Tensor> apply_rms_update(const std::vector<RmsUpdateItem>& items,
                                         const UpdateParams& p, const at::Tensor& ok) {
  // Items without elements change nothing and their ratio is 0 / (0 + eps): they are answered
  // here (a call of only such items would give the CUDA kernels a grid of zero blocks).
  const auto empty = [](const RmsUpdateItem& item) {
    return item.param.numel() == 0 && item.Os.numel() == 0 && item.delta.numel() == 0;
  };
  const detail::Split<RmsUpdateItem> by_size = detail::split(items, empty);
  std::vector<at::Tensor> zeros;
  for (const RmsUpdateItem& item : by_size.taken)
    zeros.push_back(at::zeros({}, item.delta.options()));
  const std::vector<RmsUpdateItem>& rest = by_size.rest;
#ifdef FOGO_WITH_CUDA
  // The kernel computes lr's scalars in double: another lr.dtype takes the reference (as Muon's).
  const auto fused = [&p](const RmsUpdateItem& item) {
    return (p.lr.dtype == at::kDouble || p.lr.on_device()) && item.param.is_contiguous() &&
           storable(item.param) && storable(item.Os) && cuda_f32({&item.delta});
  };
  const auto parts = count(detail::split(rest, fused));
  return by_size.merge(zeros, parts.merge(cuda::apply_rms_update(parts.taken, p, ok),
                                          fogo::ref::apply_rms_update(parts.rest, p, ok)));
#else
  note(0, rest.size());
  return by_size.merge(zeros, fogo::ref::apply_rms_update(rest, p, ok));
#endif
}

void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p) {
#ifdef FOGO_WITH_CUDA
  // The kernel computes lr's scalars in double: another lr.dtype (a Tensor lr's) takes ATen's.
  const auto fused = [&p](const MuonUpdateItem& item) {
    return (p.lr.dtype == at::kDouble || p.lr.on_device()) && item.param.is_contiguous() &&
           item.param.dim() >= 1 && storable(item.param) && storable(item.O) && item.O.dim() == 2;
  };
  const auto parts = count(detail::split(items, fused));
  cuda::muon_update(parts.taken, p);
  fogo::ref::muon_update(parts.rest, p);
#else
  note(0, items.size());
  fogo::ref::muon_update(items, p);
#endif
}

}  // namespace fogo::ops

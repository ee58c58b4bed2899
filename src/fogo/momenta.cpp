#include "fogo_private/fogo/momenta.h"

#include <ATen/ATen.h>

namespace fogo {

void ref::momenta_step(const std::vector<MomentaItem>& all, double mu_s, double mu_f,
                       const at::Tensor& ok) {
  // Empty parameters have nothing to update and no matrix view (0 rows: numel / rows is 0 / 0):
  // skipped, as the CUDA kernel skips them.
  std::vector<MomentaItem> items;
  for (const MomentaItem& item : all) {
    if (item.Bs.numel() > 0) items.push_back(item);
  }
  if (items.empty()) return;
  std::vector<at::Tensor> slow, fast, G;
  for (const MomentaItem& item : items) {
    slow.push_back(item.Bs);
    fast.push_back(item.Bf);
    G.push_back(ok.defined() ? at::where(ok, item.G, -0.0) : item.G);
  }
  // Multi-tensor ops: a few launches for the whole group instead of two per tensor; per tensor,
  // the arithmetic of mul_ and add_.
  const auto accumulate = [&](std::vector<at::Tensor>& M, double mu) {
    if (ok.defined()) {
      at::_foreach_mul_(M, at::where(ok, mu, 1.0).to(at::kFloat));
    } else {
      at::_foreach_mul_(M, mu);
    }
    at::_foreach_add_(M, G);
  };
  accumulate(slow, mu_s);
  accumulate(fast, mu_f);
  for (const MomentaItem& item : items) {
    const auto working = [&](const at::Tensor& B) {
      const at::Tensor flat = B.reshape({B.size(0), B.numel() / B.size(0)});
      return item.transposed ? flat.t() : flat;
    };
    if (item.Xs.defined()) item.Xs.copy_(working(item.Bs));
    if (item.Xf.defined()) item.Xf.copy_(working(item.Bf));
  }
}

}  // namespace fogo

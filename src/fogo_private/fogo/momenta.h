#pragma once
// Step 1 (docs/algorithm.md): both momentum streams, B_s = mu_s B_s + G and B_f = mu_f B_f + G, and
// with them the Newton–Schulz inputs of step 2: each stream in the working orientation and the
// NS compute dtype, written in the same pass (on CUDA one kernel reads G, B_s, B_f once and
// writes both momenta and both inputs; ops.h dispatches).

#include <ATen/Tensor.h>

#include <vector>

namespace fogo {

/// One parameter's step 1. Bs, Bf: fp32 momenta in the parameter's shape, updated in place; G:
/// its fp32 gradient, same shape. Xs, Xf: contiguous [m, n] inputs of step 2 (the parameter's 2-D
/// view [rows, cols], transposed when `transposed`), any floating dtype; undefined when this
/// rank does not orthogonalize the parameter (data-parallel sharding).
struct MomentaItem {
  at::Tensor Bs, Bf, G, Xs, Xf;
  bool transposed = false;
};

/// B = mu B + G for both streams of every item (each product and sum rounded in fp32, as ATen's
/// mul_ and add_ round them), then X = B's working view in X's dtype. With `ok` (a 0-d bool on
/// the items' device, NonFinitePolicy::Mask): where it is false, B = B * 1 + (-0), which keeps
/// every bit of B (-0 included), and X is still written from it. Items without elements are
/// skipped (nothing is written), on every device.
namespace ref {
void momenta_step(const std::vector<MomentaItem>& items, double mu_s, double mu_f,
                  const at::Tensor& ok);
}  // namespace ref

}  // namespace fogo

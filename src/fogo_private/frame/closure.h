#pragma once
// An optimizer step's closure, as every optimizer of fogo runs it (the frame, the hybrid,
// FusedAdamW).
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

namespace fogo::detail {

/// Runs `closure` with autograd on, as LibTorch's optimizers do even inside a NoGradGuard: it
/// computes a loss and its gradients. Returns its loss, or an undefined tensor without a closure.
inline torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace fogo::detail

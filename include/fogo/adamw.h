#pragma once
// fogo::FusedAdamW: LibTorch's AdamW stepped by PyTorch's fused AdamW kernel.
//
// torch::optim::AdamW steps one parameter at a time, a dozen ATen ops each (on a GPU a dozen
// kernel launches per parameter); at::_fused_adamw_ (the kernel behind torch.optim.AdamW's
// fused=True, on CPU and CUDA) steps a whole list of parameters in one call, each element read
// and written once. FusedAdamW is a torch::optim::AdamW in everything but the arithmetic's order:
// the same options, param groups, per-parameter state (AdamWParamState, its step an int64) and
// save()/load(), so a checkpoint of either class loads into the other and code written for
// torch::optim::AdamW (a dynamic_cast, HybridOptimizer's Mask) works on it unchanged.

#include <torch/optim/adamw.h>

#include <cstddef>

namespace fogo {

/// torch::optim::AdamW whose step() runs at::_fused_adamw_, once per param group, device and
/// dtype, for the parameters whose tensors it takes: dense and contiguous, on CPU or CUDA,
/// floating point (fp32, fp64, bf16, fp16) with a gradient and state of the parameter's dtype and
/// device (the state torch::optim::AdamW creates). Any other parameter (a sparse or
/// non-contiguous gradient, a complex parameter, state loaded onto another device, amsgrad turned
/// on after its state was made) is stepped by torch::optim::AdamW::step itself, before the fused
/// calls, so its errors (sparse gradients: "AdamW does not support sparse gradients") come before
/// anything changed.
///
/// The numbers are torch::optim::AdamW's to rounding: the kernel evaluates the same formulas
/// (decoupled decay p *= 1 - lr x weight_decay; bias corrections in double from the step count) in
/// another order, and for bf16/fp16 parameters in fp32 with one rounding per stored tensor where
/// torch::optim::AdamW rounds after every op (tests/test_adamw.cpp bounds both). The kernel reads
/// the step count as a float: exact up to 2^24 steps, rounded to 24 bits beyond.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  /// Evaluates `closure` once (with autograd on), then steps every parameter with a gradient.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// How many parameters the last step() updated through the fused kernel (the others with a
  /// gradient went through torch::optim::AdamW::step).
  size_t last_fused() const { return last_fused_; }

 private:
  size_t last_fused_ = 0;
};

}  // namespace fogo

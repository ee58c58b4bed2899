#pragma once
// fogo::MatrixOptimizer: the step frame fogo::FOGO and fogo::Muon share, written once.
//
//   step(closure) = step_with({}, closure):
//     1. validate     every group's options, every parameter with a gradient, its state and its
//                     gradient's kind, before anything changes (a bad input changes nothing)
//     2. policy       each group's NonFinitePolicy: Raise and Skip groups read their gradients'
//                     usability back to the host (one synchronisation for the step), Mask groups
//                     get one flag on the device for the step, Unchecked groups nothing
//     3. groups       step_group() of each group with gradients (from its CUDA graph or eagerly:
//                     detail::run_group), which restores what a masked step changed
//                     (detail::MaskScope) before it returns
//     4. finish       finish_step() (Muon's sharded exchange)
//
// A caller that steps several optimizers as one (HybridOptimizer) decides the policy for the
// whole step itself and passes what it decided in a StepContext: nothing is coordinated at a
// distance.

#include <ATen/Tensor.h>
#include <fogo/nonfinite.h>
#include <fogo/step_shard.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace fogo {

/// What the caller of a step decided for it. Default: nothing; the optimizer checks its own
/// gradients by each group's NonFinitePolicy.
struct StepContext {
  /// The caller read every gradient of the step back and found each usable (its Raise or Skip):
  /// nothing is read back again and nothing is masked.
  bool grads_checked = false;
  /// The caller's Mask flag for the whole step (a 0-d bool on a device, true when every gradient
  /// it tested is usable): the Mask groups mask by it instead of testing their own gradients.
  at::Tensor ok;
};

class MatrixOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  /// One step of every param group with nothing decided by a caller: step_with({}, closure).
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// One step of every param group, after `closure` (run with autograd on), with what the caller
  /// decided. Everything that can be checked is checked before anything changes; what cannot be
  /// undone: a failure of the device itself in the middle of a step (out of memory, a CUDA fault)
  /// may leave earlier groups stepped.
  torch::Tensor step_with(const StepContext& context, LossClosure closure = nullptr);

  /// Group `group`'s NonFinitePolicy option.
  virtual NonFinitePolicy nonfinite(size_t group) const = 0;
  /// Data-parallel sharding of the step (fogo::dist::shard_step sets it; step_shard.h).
  virtual void set_step_shard(StepShard shard) = 0;

 protected:
  /// One param group's part of a step: its parameters with gradients (in the group's order), and
  /// under NonFinitePolicy::Mask the step's flag on the group's device (else undefined).
  struct GroupStep {
    size_t group = 0;
    std::vector<at::Tensor> params, grads;
    at::Tensor ok;
  };

  /// The optimizer's name, for messages ("FOGO", "Muon").
  virtual const char* name() const = 0;
  /// Throws naming what is wrong with group `g`'s options.
  virtual void check_group(size_t g) const = 0;
  /// Throws naming what is wrong with parameter `i` of group `g` (it has a gradient) or its state.
  virtual void check_param(size_t g, size_t i, const at::Tensor& p) const = 0;
  /// How group `g`'s gradients are checked at this step: its policy, or the one it stands for now
  /// (FOGO: Mask on a group's first step is checked as Skip; its codebook is built from it).
  virtual NonFinitePolicy policy_now(size_t g) const { return nonfinite(g); }
  /// One group's step (device work; state created on the host first).
  virtual void step_group(const GroupStep& group) = 0;
  /// After every group has stepped.
  virtual void finish_step(const std::vector<GroupStep>& groups) { (void)groups; }
};

}  // namespace fogo

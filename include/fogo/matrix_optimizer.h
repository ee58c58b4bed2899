#pragma once
// fogo::MatrixOptimizer: the step frame fogo::FOGO and fogo::Muon share, written once.
//
//   step(closure) = step_with({}, closure):
//     1. validate     every group's options, every parameter with a gradient, its state, its
//                     gradient's kind and the step's scalars (lr, lr x weight_decay), before
//                     anything changes (a bad input changes nothing)
//     2. policy       decide_nonfinite (nonfinite.h) over every gradient of the step, each by its
//                     group's NonFinitePolicy: Raise throws naming the parameter, Skip returns,
//                     both having changed nothing; Mask gives every group the step's flag
//     3. groups       step_group() of each group with gradients (from its CUDA graph or eagerly:
//                     detail::run_group), which restores what a masked step changed
//                     (detail::MaskScope) before it returns
//     4. finish       finish_step() (Muon's sharded exchange)
//
// A caller that steps several optimizers as one (HybridOptimizer, the Python package) takes the
// decision for the whole step itself and passes it in a StepContext: nothing is coordinated at a
// distance.

#include <ATen/Tensor.h>
#include <fogo/matrix_view.h>
#include <fogo/nonfinite.h>
#include <fogo/param_groups.h>
#include <fogo/step_shard.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <vector>

namespace fogo {

/// What the caller of a step decided for it. Default: nothing; the optimizer decides by its
/// groups' NonFinitePolicy.
struct StepContext {
  /// The caller's decision (decide_nonfinite) over every gradient it steps, this optimizer's
  /// among them, each by its policy (nonfinite(g)) and with maskable() part of its `maskable`:
  /// Step (nothing is read back or masked) or Mask (every group masked by its `ok`). A caller
  /// that decided Skip or Raise does not step.
  std::optional<NonFiniteDecision> decided;
};

class MatrixOptimizer : public torch::optim::Optimizer, public ExactParamGroups {
 public:
  /// Every group keeps exactly the options it is given (its own, or `defaults` when it has none),
  /// on every LibTorch (param_groups.h).
  MatrixOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                  std::unique_ptr<torch::optim::OptimizerOptions> defaults);

  /// Adds `group` with exactly its own options (or the defaults when it has none). It hides
  /// torch::optim::Optimizer::add_param_group, which since torch 2.15 replaces them by the
  /// defaults: a group added through a torch::optim::Optimizer& there is refused at the next step.
  void add_param_group(const torch::optim::OptimizerParamGroup& group);
  void add_param_group_exactly(const torch::optim::OptimizerParamGroup& group) override {
    add_param_group(group);
  }

  /// One step of every param group with nothing decided by a caller: step_with({}, closure).
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// One step of every param group, after `closure` (run with autograd on), with what the caller
  /// decided. Everything that can be checked is checked before anything changes; what cannot be
  /// undone: a failure of the device itself in the middle of a step (out of memory, a CUDA fault)
  /// may leave earlier groups stepped.
  torch::Tensor step_with(const StepContext& context, LossClosure closure = nullptr);

  /// Group `group`'s NonFinitePolicy option.
  virtual NonFinitePolicy nonfinite(size_t group) const = 0;
  /// The NonFinitePolicy of the defaults (the constructor's options): what a HybridOptimizer
  /// applies to its other side's gradients.
  virtual NonFinitePolicy default_nonfinite() const = 0;
  /// Whether group `g`'s step can be masked now (NonFinitePolicy::Mask): FOGO's first step of a
  /// group cannot (its codebook is built from it; there is no earlier memory to keep).
  virtual bool maskable(size_t g) const {
    (void)g;
    return true;
  }
  /// Group `g`'s decoupled weight decay (p *= 1 - lr x weight_decay at each step; 0 for none):
  /// the frame refuses lr x weight_decay > 1 before anything changes.
  virtual double weight_decay(size_t g) const = 0;
  /// Data-parallel sharding of the step (fogo::dist::shard_step sets it; step_shard.h).
  virtual void set_step_shard(StepShard shard) = 0;
  /// The matrices the step orthogonalizes in `param` of group `group` (matrix_view.h): the units
  /// of a sharded step's work. The default: the parameter is one matrix.
  virtual MatrixView matrix_view(size_t group, const at::Tensor& param) const;

 protected:
  /// One param group's part of a step: its parameters with gradients (in the group's order), and
  /// when the step is masked (NonFiniteDecision::Mask) the step's flag on the group's device (else
  /// undefined): where it is false, step_group must leave every tensor as it was.
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
  /// One group's step (device work; state created on the host first).
  virtual void step_group(const GroupStep& group) = 0;
  /// After every group has stepped.
  virtual void finish_step(const std::vector<GroupStep>& groups) { (void)groups; }

 private:
  /// How many param groups came in through add_param_group above (the rest, if any, through
  /// torch::optim::Optimizer's: refused where that dropped their options).
  size_t exact_groups_ = 0;
};

}  // namespace fogo

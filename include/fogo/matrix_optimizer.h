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
//     3. groups       step_group() of each group with gradients, which restores what a masked
//                     step changed before it returns; GroupFrame (below) writes it once:
//                       create_state()  the group's state, on the host
//                       prepare_step()  the optimizer's host preparation (per-step tensors)
//                       device_step()   from the group's CUDA graph (captured again when the
//                                       tensors it touches or the options other than lr change)
//                                       or eagerly, inside the Mask scope of masked_tensors()
//                       finish_group()
//     4. finish       finish_step() (Muon's sharded exchange)
//
// A matrix optimizer (fogo::FOGO, fogo::Muon) derives from MatrixOptimizerOf<Options> and writes
// its hooks: its state, its host preparation, the tensors its step touches, its device step.
//
// A caller that steps several optimizers as one (HybridOptimizer, the Python package) takes the
// decision for the whole step itself and passes it in a StepContext: nothing is coordinated at a
// distance.

#include <ATen/Tensor.h>
#include <fogo/device_step.h>
#include <fogo/matrix_view.h>
#include <fogo/nonfinite.h>
#include <fogo/param_groups.h>
#include <fogo/step_shard.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
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
  /// What the frame itself requires of parameter `i` of group `g`, checked after check_param.
  /// Default: nothing.
  virtual void check_frame_param(size_t g, size_t i, const at::Tensor& p) const {
    (void)g, (void)i, (void)p;
  }
  /// One group's step (device work; state created on the host first).
  virtual void step_group(const GroupStep& group) = 0;
  /// After every group has stepped.
  virtual void finish_step(const std::vector<GroupStep>& groups) { (void)groups; }

 private:
  /// How many param groups came in through add_param_group above (the rest, if any, through
  /// torch::optim::Optimizer's: refused where that dropped their options).
  size_t exact_groups_ = 0;
};

/// MatrixOptimizer with its group step written once: state creation, the choice between the
/// group's CUDA graph and an eager step, the saved states a failed capture puts back, the Mask
/// scope, the learning rate and the sharding hook. An optimizer writes the hooks below.
class GroupFrame : public MatrixOptimizer {
 public:
  GroupFrame(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
             std::unique_ptr<torch::optim::OptimizerOptions> defaults);
  ~GroupFrame() override;
  GroupFrame(GroupFrame&&) noexcept;
  GroupFrame& operator=(GroupFrame&&) noexcept;

  /// Data-parallel sharding (fogo::dist::shard_step sets it; step_shard.h): the optimizer's step
  /// reads it (step_shard()); a sharded step is never captured in a CUDA graph (it exchanges
  /// with the ranks). An empty StepShard turns sharding off.
  void set_step_shard(StepShard shard) override;

  /// The dtype of group `group`'s learning-rate arithmetic on the host (1 - lr wd, the adjusted
  /// lr): double by default; a Tensor lr's dtype for torch.optim.Muon's bits with one (fogo.Muon
  /// in Python sets it from the group's lr). A CUDA graph's step reads lr on the device in double
  /// whatever this says.
  void set_lr_dtype(size_t group, at::ScalarType dtype);

  /// The group's option cuda_graph: how often its step was captured (its first graphed step,
  /// and again when its parameters, state or options other than lr change) and run from a graph.
  struct GraphStats {
    int64_t captures = 0, replays = 0;
  };
  GraphStats graph_stats(size_t group) const;

 protected:
  /// What the host preparation gives the device step: its own per-step tensors (static inputs of
  /// a graph: StepInputs::extra) and whether this step may run from a graph.
  struct HostStep {
    std::vector<at::Tensor> extra;
    bool graphable = true;
  };

  const StepShard& step_shard() const { return shard_; }
  /// Whether this rank runs the per-matrix work of matrix `k` of `param` (always, unsharded).
  bool owns(const at::Tensor& param, int64_t k) const {
    return !shard_.owns || shard_.owns(param, k);
  }
  /// Sharded: every matrix of every parameter with a gradient from its owner, values[i] = {the
  /// matrix's view of the parameter, then shard_values()} (a collective: every rank calls it).
  /// Unsharded: nothing.
  void finish_step(const std::vector<GroupStep>& groups) override;
  /// What a sharded step sends with matrix `k` (of view `view`) of parameter `param` of group `g`
  /// besides the parameter's matrix: state only its owner updates. Default: nothing.
  virtual std::vector<at::Tensor> shard_values(size_t g, const at::Tensor& param,
                                               const MatrixView& view, int64_t k) const;

  /// Throws naming what is wrong with parameter `i` of group `g` or its state, beyond what the
  /// frame checks itself (a gradient's kind, the step's scalars, a CUDA graph's device). Default:
  /// nothing.
  void check_param(size_t g, size_t i, const at::Tensor& p) const override {
    (void)g, (void)i, (void)p;
  }
  /// A param group with option cuda_graph steps on a CUDA device only.
  void check_frame_param(size_t g, size_t i, const at::Tensor& p) const final;
  /// Creates the state of the group's parameters that have none (on the host, before any device
  /// work or capture).
  virtual void create_state(const GroupStep& s) = 0;
  /// The optimizer's host preparation of the step (after create_state). Default: nothing.
  virtual HostStep prepare_step(const GroupStep& s) {
    (void)s;
    return {};
  }
  /// Every tensor the device step reads or writes besides its StepInputs (parameters, state):
  /// a graph is captured again when one of them changes.
  virtual std::vector<at::Tensor> touched(const GroupStep& s) const = 0;
  /// The group's device work: the same host code eagerly and inside a capture.
  virtual void device_step(const StepInputs& in) = 0;
  /// The tensors the frame copies before a masked device step and puts back where the flag is
  /// false. Default: every tensor touched() lists (the parameters and the state), so that a new
  /// optimizer's masked step changes nothing without writing this. FOGO's and Muon's updates
  /// take the flag and leave the parameters as they are themselves, with no copy (issue 44):
  /// Muon lists its state only, FOGO nothing (it masks inside its stages).
  virtual std::vector<at::Tensor> masked_tensors(const StepInputs& in) const;
  /// What the host code of device_step may change, saved just before a capture: returns what
  /// puts it back. Default: the group's parameters' state entries (detail::SavedStates).
  virtual std::function<void()> save_host_state(const GroupStep& s);
  /// After the group's device step (host bookkeeping). Default: nothing.
  virtual void finish_group(const GroupStep& s) { (void)s; }
  /// Group `g`'s option cuda_graph.
  virtual bool cuda_graph(size_t g) const = 0;
  /// Whether two options of this optimizer are equal apart from lr.
  virtual bool same_except_lr(const torch::optim::OptimizerOptions& a,
                              const torch::optim::OptimizerOptions& b) const = 0;

 private:
  void step_group(const GroupStep& s) final;
  void run_device_step(const StepInputs& in);
  StepShard shard_;
  std::vector<at::ScalarType> lr_dtypes_;  // per group; missing ones double
  struct Graphs;
  std::unique_ptr<Graphs> graphs_;
};

/// GroupFrame for options of type Options (fogo's option tables: validate(), nonfinite(),
/// weight_decay(), cuda_graph(), operator==): option access and the frame's option hooks.
template <class Options>
class MatrixOptimizerOf : public GroupFrame {
 public:
  MatrixOptimizerOf(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                    const Options& defaults)
      : GroupFrame(param_groups, std::make_unique<Options>(defaults)) {}

  NonFinitePolicy nonfinite(size_t group) const override {
    TORCH_CHECK(group < param_groups_.size(), name(), "::nonfinite: group ", group,
                " does not exist (", param_groups_.size(), " groups)");
    return options(group).nonfinite();
  }
  NonFinitePolicy default_nonfinite() const override {
    return static_cast<const Options&>(defaults()).nonfinite();
  }
  double weight_decay(size_t g) const override { return options(g).weight_decay(); }

 protected:
  const Options& options(size_t g) const {
    return static_cast<const Options&>(param_groups_[g].options());
  }
  void check_group(size_t g) const override { options(g).validate(); }
  bool cuda_graph(size_t g) const override { return options(g).cuda_graph(); }
  bool same_except_lr(const torch::optim::OptimizerOptions& a,
                      const torch::optim::OptimizerOptions& b) const override {
    Options x = static_cast<const Options&>(a), y = static_cast<const Options&>(b);
    x.set_lr(0.0);
    y.set_lr(0.0);
    return x == y;
  }
};

}  // namespace fogo

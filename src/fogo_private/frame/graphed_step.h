#pragma once
// The CUDA-graph mode of fogo's optimizers (FOGOOptions::cuda_graph, MuonOptions::cuda_graph): a
// param group's device work captured once and replayed. What changes from step to step is a
// static input of the graph (StepInputs), refreshed on the stream before each replay: the
// gradients (read in place when they are the tensors seen at capture, else copied in), small
// per-step tensors (the Mask flag, FOGO's candidate keys) and the learning rate (its device
// scalar, float64). The work is
// captured again whenever its layout (every tensor it touches, by address, type and shape, and
// whatever else the caller folds in) differs from the captured one.
//
// A capture runs the work's host code but nothing on the device. If it fails, the work runs
// eagerly instead (now and from then on), from the optimizer's state as it was: what the host
// code may have changed (the caller's `save`, e.g. SavedStates) is put back first.

#include <ATen/Tensor.h>
#include <fogo/device_step.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fogo::detail {

/// What a step's host code may change, saved before a capture: returns what puts it back.
using SaveHostState = std::function<std::function<void()>()>;

/// The state entries of `params` in `optimizer` as they are now, each with its tensors (the
/// same tensors, not copies: a failed capture ran nothing on the device), put back by restore()
/// in place of whatever entry the parameter has then; a parameter without an entry loses the one
/// it got meanwhile.
class SavedStates {
 public:
  SavedStates(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params);
  void restore();

 private:
  torch::optim::Optimizer* optimizer_;
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> saved_;
};

/// Test seam: `hook` runs inside every capture this thread makes from now on, after the work has
/// been recorded (null: none). A hook that throws fails the capture, as a call that may not be
/// captured (a synchronisation) inside the work would.
void set_capture_hook_for_testing(std::function<void()> hook);

class GraphedStep {
 public:
  GraphedStep();
  ~GraphedStep();
  GraphedStep(GraphedStep&&) noexcept;
  GraphedStep& operator=(GraphedStep&&) noexcept;

  /// Appends what captured work depends on of `t`: its address, type, shape and strides (-1:
  /// undefined).
  static void describe(std::vector<int64_t>& layout, const at::Tensor& t);

  /// Runs `work` from the graph: captures it (and runs it once) when there is no graph or
  /// `layout` differs from the captured one, else refreshes the static inputs from `in` (its
  /// gradients, flag, extra tensors and lr.value) and replays. `layout` need not describe the
  /// inputs: their types and shapes are added here. `save` (may be null) is called just before a
  /// capture. If the capture fails nothing has run on the device: what `save` returned puts the
  /// host state back, a warning names `who`, failed() turns true and false is returned, for the
  /// caller to run the step eagerly (now and from then on). An error of the replay after a
  /// capture is the step's own (the work may have run in part): it propagates.
  bool run(std::vector<int64_t> layout, const StepInputs& in, const c10::Device& device,
           const std::function<void(const StepInputs&)>& work, const std::string& who,
           const SaveHostState& save = {});

  bool failed() const { return failed_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  struct Graph;  // cuda::StepGraph in builds with CUDA
  std::unique_ptr<Graph> graph_;
  StepInputs inputs_;
  std::vector<int64_t> layout_;
  int64_t captures_ = 0, replays_ = 0;
  bool failed_ = false;
};

/// A param group's GraphedStep and its options as last seen: a change of any option but lr (the
/// graph reads lr on the device) starts a new epoch, which begins the layout, so the step is
/// captured again.
class GroupGraph {
 public:
  GraphedStep step;
  /// The epoch of a step with options `o`; `same_except_lr` compares two options of the
  /// optimizer apart from lr.
  int64_t epoch(const torch::optim::OptimizerOptions& o,
                const std::function<bool(const torch::optim::OptimizerOptions&,
                                         const torch::optim::OptimizerOptions&)>& same_except_lr) {
    if (!last_ || !same_except_lr(o, *last_)) {
      last_ = o.clone();
      ++epoch_;
    }
    return epoch_;
  }

 private:
  std::unique_ptr<torch::optim::OptimizerOptions> last_;
  int64_t epoch_ = 0;
};

}  // namespace fogo::detail

#include "fogo_private/frame/graphed_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#ifdef FOGO_WITH_CUDA
#include "fogo_private/cuda/step_graph.h"
#endif

namespace fogo::detail {

#ifdef FOGO_WITH_CUDA
struct GraphedStep::Graph : cuda::StepGraph {};
#else
struct GraphedStep::Graph {};
#endif

namespace {
thread_local std::function<void()> capture_hook;  // set_capture_hook_for_testing
}  // namespace

void set_capture_hook_for_testing(std::function<void()> hook) { capture_hook = std::move(hook); }

SavedStates::SavedStates(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params)
    : optimizer_(&optimizer) {
  for (const at::Tensor& p : params) {
    void* key = p.unsafeGetTensorImpl();
    const auto it = optimizer.state().find(key);
    saved_.emplace_back(key, it == optimizer.state().end() ? nullptr : it->second->clone());
  }
}

void SavedStates::restore() {
  auto& state = optimizer_->state();
  for (auto& [key, entry] : saved_) {
    if (entry) {
      state[key] = entry->clone();
    } else {
      state.erase(key);
    }
  }
}

GraphedStep::GraphedStep() = default;
GraphedStep::~GraphedStep() = default;
GraphedStep::GraphedStep(GraphedStep&&) noexcept = default;
GraphedStep& GraphedStep::operator=(GraphedStep&&) noexcept = default;

void GraphedStep::describe(std::vector<int64_t>& layout, const at::Tensor& t) {
  if (!t.defined()) {
    layout.push_back(-1);
    return;
  }
  layout.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
  layout.push_back(static_cast<int64_t>(t.scalar_type()));
  layout.push_back(t.dim());
  layout.insert(layout.end(), t.sizes().begin(), t.sizes().end());
  layout.insert(layout.end(), t.strides().begin(), t.strides().end());
}

namespace {

// The per-step tensors of `in` the graph reads as static inputs, in order: the gradients, the
// flag, the extra tensors.
std::vector<const at::Tensor*> refreshed(const StepInputs& in) {
  std::vector<const at::Tensor*> out;
  for (const at::Tensor& t : in.grads) out.push_back(&t);
  out.push_back(&in.ok);
  for (const at::Tensor& t : in.extra) out.push_back(&t);
  return out;
}

}  // namespace

bool GraphedStep::run(std::vector<int64_t> layout, const StepInputs& in, const c10::Device& device,
                      const std::function<void(const StepInputs&)>& work, const std::string& who,
                      const SaveHostState& save) {
#ifdef FOGO_WITH_CUDA
  // The inputs' types and shapes (not their addresses: they are copied into the static ones).
  for (const at::Tensor* t : refreshed(in)) {
    layout.push_back(t->defined() ? static_cast<int64_t>(t->scalar_type()) : -1);
    if (t->defined()) layout.insert(layout.end(), t->sizes().begin(), t->sizes().end());
    layout.push_back(-2);  // separator: shapes of different ranks stay distinct
  }
  if (graph_ && layout == layout_) {
    for (size_t k = 0; k < in.grads.size(); ++k) {
      if (!in.grads[k].is_same(inputs_.grads[k])) inputs_.grads[k].copy_(in.grads[k]);
    }
    if (in.ok.defined()) inputs_.ok.copy_(in.ok);
    for (size_t k = 0; k < in.extra.size(); ++k) {
      if (in.extra[k].defined()) inputs_.extra[k].copy_(in.extra[k]);
    }
    inputs_.lr.device.fill_(in.lr.value);
    graph_->replay();
    ++replays_;
    return true;
  }
  graph_.reset();  // the old graph and its memory pool go
  const auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  inputs_ = {in.group,
             in.params,
             in.grads,
             copy(in.ok),
             LearningRate(
                 in.lr.value, in.lr.dtype,
                 at::full({}, in.lr.value, at::TensorOptions().dtype(at::kDouble).device(device))),
             {}};
  for (const at::Tensor& t : in.extra) inputs_.extra.push_back(copy(t));
  layout_ = std::move(layout);
  auto graph = std::make_unique<Graph>();
  const std::function<void()> restore = save ? save() : nullptr;
  try {
    graph->capture(
        [&] {
          work(inputs_);
          if (capture_hook) capture_hook();
        },
        device);
  } catch (const std::exception& e) {
    if (restore) restore();
    TORCH_WARN(who, "'s step could not be captured in a CUDA graph; it steps without one from ",
               "now on. The capture failed with: ", e.what());
    failed_ = true;
    return false;
  }
  graph_ = std::move(graph);
  ++captures_;
  graph_->replay();  // the step: an error here is not a failed capture (the work may have run)
  ++replays_;
  return true;
#else
  (void)layout, (void)in, (void)device, (void)work, (void)save;
  TORCH_CHECK(false, who, " asks for a CUDA graph in a build of fogo without CUDA");
  return false;
#endif
}

}  // namespace fogo::detail

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

bool GraphedStep::run(std::vector<int64_t> layout, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& tensors, double lr, const c10::Device& device,
                      const std::function<void(const Inputs&)>& work, const std::string& who,
                      const SaveHostState& save) {
#ifdef FOGO_WITH_CUDA
  // The inputs' types and shapes (not their addresses: they are copied into the static ones).
  for (const auto* list : {&grads, &tensors}) {
    for (const at::Tensor& t : *list) {
      layout.push_back(t.defined() ? static_cast<int64_t>(t.scalar_type()) : -1);
      if (t.defined()) layout.insert(layout.end(), t.sizes().begin(), t.sizes().end());
      layout.push_back(-2);  // separator: shapes of different ranks stay distinct
    }
  }
  if (graph_ && layout == layout_) {
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].is_same(inputs_.grads[k])) inputs_.grads[k].copy_(grads[k]);
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (tensors[k].defined()) inputs_.tensors[k].copy_(tensors[k]);
    }
    inputs_.lr.fill_(lr);
    graph_->replay();
    ++replays_;
    return true;
  }
  graph_.reset();  // the old graph and its memory pool go
  inputs_ = {grads, {}, at::full({}, lr, at::TensorOptions().dtype(at::kDouble).device(device))};
  for (const at::Tensor& t : tensors) inputs_.tensors.push_back(t.defined() ? t.clone() : t);
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
  (void)layout, (void)grads, (void)tensors, (void)lr, (void)device, (void)work, (void)save;
  TORCH_CHECK(false, who, " asks for a CUDA graph in a build of fogo without CUDA");
  return false;
#endif
}

}  // namespace fogo::detail

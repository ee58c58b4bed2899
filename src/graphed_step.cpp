#include "graphed_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#ifdef FOGO_WITH_CUDA
#include "step_graph.h"
#endif

namespace fogo::detail {

#ifdef FOGO_WITH_CUDA
struct GraphedStep::Graph : cuda::StepGraph {};
#else
struct GraphedStep::Graph {};
#endif

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
                      const std::function<void(const Inputs&)>& work, const std::string& who) {
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
  try {
    graph->capture_and_run([&] { work(inputs_); }, device);
  } catch (const std::exception& e) {
    TORCH_WARN(who, "'s step could not be captured in a CUDA graph; it steps without one from ",
               "now on. The capture failed with: ", e.what());
    failed_ = true;
    return false;
  }
  graph_ = std::move(graph);
  ++captures_;
  ++replays_;
  return true;
#else
  (void)layout, (void)grads, (void)tensors, (void)lr, (void)device, (void)work;
  TORCH_CHECK(false, who, " asks for a CUDA graph in a build of fogo without CUDA");
  return false;
#endif
}

}  // namespace fogo::detail

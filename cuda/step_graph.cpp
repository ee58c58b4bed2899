#include "step_graph.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace fogo::cuda {

StepGraph::StepGraph() = default;
StepGraph::~StepGraph() = default;
StepGraph::StepGraph(StepGraph&&) noexcept = default;
StepGraph& StepGraph::operator=(StepGraph&&) noexcept = default;

void StepGraph::capture_and_run(const std::function<void()>& work, const c10::Device& device) {
  graph_.reset();
  const c10::cuda::CUDAGuard device_guard(device);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  {
    const c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, device.index()));
    // Thread-local mode: a forbidden call (a synchronisation, say) made by this thread fails the
    // capture; other threads of the program (data loaders) are not affected.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      work();
    } catch (...) {
      try {
        graph->capture_end();  // ends the (invalidated) capture; throws for it
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
  }
  graph->replay();  // on the current stream: after what the caller has queued
  graph_ = std::move(graph);
}

void StepGraph::replay() {
  TORCH_CHECK(graph_ != nullptr, "fogo::cuda::StepGraph::replay: nothing captured");
  graph_->replay();
}

}  // namespace fogo::cuda

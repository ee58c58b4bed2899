#pragma once
// A CUDA graph of an optimizer step's device work (FOGOOptions::cuda_graph): captured once on a
// side stream (capture needs a non-default stream; nothing runs during capture), then replayed on
// the caller's current stream, after the work already queued there.

#include <c10/core/Device.h>

#include <functional>
#include <memory>

namespace at::cuda {
struct CUDAGraph;
}

namespace fogo::cuda {

class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(StepGraph&&) noexcept;
  StepGraph& operator=(StepGraph&&) noexcept;

  /// Records `work` on `device` (nothing runs: replay() runs it). `work` must be device work
  /// only: no host synchronisation, no pinned allocation, nothing decided from device values.
  /// What it allocates comes from the graph's own memory pool, reused by every replay. If the
  /// capture fails, nothing has run on the device, the graph stays empty and the error is
  /// rethrown.
  void capture(const std::function<void()>& work, const c10::Device& device);
  /// Runs the recorded work on the capture device's current stream, after the work queued there.
  void replay();
  bool empty() const { return graph_ == nullptr; }

 private:
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  c10::Device device_{c10::kCUDA};
};

}  // namespace fogo::cuda

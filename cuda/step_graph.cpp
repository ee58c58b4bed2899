#include "fogo_private/cuda/step_graph.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

namespace fogo::cuda {
namespace {

// One capture stream per device for the whole process, created here rather than taken from
// PyTorch's pool: cuBLAS keeps a workspace per (handle, stream), allocated at a stream's first GEMM
// (in a capture, from that graph's pool, and kept) and baked into the graph. A stream of its own
// keeps that workspace to fogo's graphs, which replay one after another on the caller's stream;
// a pool stream could be handed to other code whose GEMMs would share it concurrently.
c10::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end()) {
    const c10::cuda::CUDAGuard guard(device);
    cudaStream_t stream = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));  // never destroyed
    it = streams.emplace(device, c10::cuda::getStreamFromExternal(stream, device)).first;
  }
  return it->second;
}

}  // namespace

StepGraph::StepGraph() = default;
StepGraph::~StepGraph() = default;
StepGraph::StepGraph(StepGraph&&) noexcept = default;
StepGraph& StepGraph::operator=(StepGraph&&) noexcept = default;

void StepGraph::capture(const std::function<void()>& work, const c10::Device& device) {
  graph_.reset();
  const c10::cuda::CUDAGuard device_guard(device);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  const c10::cuda::CUDAStreamGuard side(capture_stream(device.index()));
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
    (void)cudaGetLastError();  // the failed call's error must not surface at a later check
    throw;
  }
  graph->capture_end();
  graph_ = std::move(graph);
  device_ = device;
}

void StepGraph::replay() {
  TORCH_CHECK(graph_ != nullptr, "fogo::cuda::StepGraph::replay: nothing captured");
  const c10::cuda::CUDAGuard device_guard(device_);
  graph_->replay();  // on the current stream: after what the caller has queued
}

}  // namespace fogo::cuda

// fogo::dist's choice of backends (dist/process_group.h): each rank's own (choose_backends), and
// the job's, settled by rank 0 from every rank's offer during the members check.
#include <torch/cuda.h>

#ifdef FOGO_DISTRIBUTED_NCCL
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>

#include "fogo_private/distributed/internal.h"

namespace fogo::dist {

namespace {

// This rank's GPU (-1: none). A process that sees exactly one was given its own by the launcher
// (CUDA_VISIBLE_DEVICES per rank: SLURM, many launchers); one that sees several sees the node's,
// numbered as LOCAL_RANK numbers the ranks. Two ranks that end on one GPU are found at start-up
// (settle_backends).
int64_t rank_cuda_device(const std::optional<torch::Device>& device, const Launch& launch,
                         int64_t cuda_devices) {
  if (device && device->is_cuda() && device->has_index()) {
    TORCH_CHECK(device->index() < cuda_devices, "fogo::dist: ProcessGroupOptions::device is ",
                *device, " but this process sees ", cuda_devices, " CUDA device(s)");
    return device->index();
  }
  if (cuda_devices == 1) return 0;
  if (launch.local_rank < cuda_devices) return launch.local_rank;
  return -1;
}

[[noreturn]] void no_gpu_for_this_rank(const char* why, const Launch& launch,
                                       int64_t cuda_devices) {
  const int64_t local_world =
      launch.local_world_size > 0 ? launch.local_world_size : launch.world_size;
  TORCH_CHECK(false, "fogo::dist: ", why,
              " needs a GPU of its own for each rank (cuda:0 when the process sees one, as "
              "CUDA_VISIBLE_DEVICES per rank gives it; else cuda:LOCAL_RANK), but LOCAL_RANK=",
              launch.local_rank, " of ", local_world, " local rank(s) finds ", cuda_devices,
              " CUDA device(s) visible. Launch at most ", cuda_devices,
              " rank(s) per node (torchrun --nproc-per-node ", std::max<int64_t>(cuda_devices, 1),
              "), or keep the job's tensors on the CPU (ProcessGroupOptions::device(torch::kCPU);"
              " the trainers' --device cpu), which communicates through Gloo");
  throw std::logic_error("unreachable");  // TORCH_CHECK(false) throws
}

}  // namespace

Backends choose_backends(const ProcessGroupOptions& options, const Launch& launch,
                         int64_t cuda_devices, bool nccl_built) {
  const auto backend = options.backend();
  const auto& device = options.device();
  TORCH_CHECK(!device || device->is_cpu() || device->is_cuda(),
              "fogo::dist: ProcessGroupOptions::device must be a CPU or CUDA device, got ",
              *device);
  Backends b;
  b.cuda_device = rank_cuda_device(device, launch, cuda_devices);
  const auto no_gpu = [&](const char* why) { no_gpu_for_this_rank(why, launch, cuda_devices); };
  switch (backend) {
    case Backend::Gloo:
      b.gloo = true;
      return b;
    case Backend::Nccl:
      TORCH_CHECK(nccl_built, "fogo::dist: backend Nccl requested but fogo was built without NCCL");
      TORCH_CHECK(!device || device->is_cuda(), "fogo::dist: backend Nccl communicates CUDA ",
                  "tensors, but ProcessGroupOptions::device is ", *device,
                  " (use Backend::Gloo or Auto for a CPU job)");
      if (b.cuda_device < 0) no_gpu("backend Nccl");
      b.nccl = true;
      return b;
    case Backend::Auto:
      break;
  }
  b.gloo = true;
  if (device && device->is_cpu()) return b;
  if (!nccl_built) {
    // Gloo carries the CUDA tensors too (through host memory: the group registers it for both
    // device types), and ranks may share a GPU; but a CUDA job needs one.
    if (device && cuda_devices == 0) no_gpu("a CUDA job");
    return b;
  }
  if (device) {
    if (b.cuda_device < 0) no_gpu("a CUDA job (ProcessGroupOptions::device cuda)");
    b.nccl = true;
    return b;
  }
  b.nccl = b.cuda_device >= 0;
  b.nccl_optional = true;
  return b;
}

bool built_with_nccl() {
#ifdef FOGO_DISTRIBUTED_NCCL
  return true;
#else
  return false;
#endif
}

namespace detail {

// "!<error>", or three flags (gloo, nccl, nccl_optional) and the GPU's identity.
std::string encode(const Offer& offer) {
  if (!offer.error.empty()) return "!" + offer.error;
  const auto& b = offer.backends;
  return std::string{b.gloo ? '1' : '0', b.nccl ? '1' : '0', b.nccl_optional ? '1' : '0'} +
         offer.gpu;
}

Offer decode(const std::string& text) {
  Offer offer;
  const auto flag = [](char c) { return c == '1'; };
  if (!text.empty() && text[0] == '!') {
    offer.error = text.substr(1);
  } else if (text.size() >= 3) {
    offer.backends.gloo = flag(text[0]);
    offer.backends.nccl = flag(text[1]);
    offer.backends.nccl_optional = flag(text[2]);
    offer.gpu = text.substr(3);
  } else {
    offer.error = "fogo::dist: unreadable backend offer '" + text + "' (another fogo version?)";
  }
  return offer;
}

JobBackends settle_backends(const std::vector<Offer>& offers) {
  JobBackends job;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (!offers[r].error.empty()) {  // every rank reports the first one
      const std::string prefix = "fogo::dist: ";
      const auto& e = offers[r].error;
      job.problem = prefix + "rank " + std::to_string(r) + " of " + std::to_string(offers.size()) +
                    " cannot start: " + (e.rfind(prefix, 0) == 0 ? e.substr(prefix.size()) : e);
      return job;
    }
  }
  // Every rank must have been given the same options, or some would wait for a NCCL peer that
  // never created its backend.
  const Backends& first = offers.at(0).backends;
  std::vector<int64_t> differing;
  for (size_t r = 1; r < offers.size(); ++r) {
    const Backends& b = offers[r].backends;
    if (b.gloo != first.gloo || b.nccl_optional != first.nccl_optional ||
        (!first.nccl_optional && b.nccl != first.nccl)) {
      differing.push_back(static_cast<int64_t>(r));
    }
  }
  if (!differing.empty()) {
    job.problem = "fogo::dist: rank(s) " + join(differing) +
                  " were given other backend options (ProcessGroupOptions::backend, device) than "
                  "rank 0; every rank needs the same";
    return job;
  }
  // GPUs taken by more than one rank (NCCL refuses two ranks on one device).
  std::map<std::string, std::vector<int64_t>> users;
  bool every_rank_has_one = true;
  for (size_t r = 0; r < offers.size(); ++r) {
    every_rank_has_one = every_rank_has_one && offers[r].backends.nccl;
    if (offers[r].backends.nccl && !offers[r].gpu.empty()) {
      users[offers[r].gpu].push_back(static_cast<int64_t>(r));
    }
  }
  std::string shared;
  for (const auto& [gpu, ranks] : users) {
    if (ranks.size() > 1) {
      shared +=
          (shared.empty() ? "" : "; ") + std::string("rank(s) ") + join(ranks) + " share " + gpu;
    }
  }
  if (first.nccl_optional) {  // Auto without a device: NCCL only where it can run
    job.nccl = every_rank_has_one && shared.empty();
    return job;
  }
  if (!first.nccl) return job;
  if (!shared.empty()) {
    job.problem =
        "fogo::dist: NCCL needs a GPU of its own for each rank, but " + shared +
        ". Give each rank its own GPU (CUDA_VISIBLE_DEVICES per rank, or at most one rank per GPU:"
        " torchrun --nproc-per-node <GPUs>), or use Backend::Gloo (CUDA tensors through host "
        "memory), or keep the job on the CPU (ProcessGroupOptions::device(torch::kCPU))";
    return job;
  }
  job.nccl = true;
  return job;
}

std::string gpu_identity(int64_t index) {
#ifdef FOGO_DISTRIBUTED_NCCL
  const auto* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  const auto* u = reinterpret_cast<const unsigned char*>(prop->uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return text;
#else
  (void)index;
  return "";
#endif
}

}  // namespace detail

void ProcessGroup::Impl::offer_backends() {
  detail::Offer mine;
  try {
    backends = choose_backends(options, launch, static_cast<int64_t>(torch::cuda::device_count()),
                               built_with_nccl());
    mine.backends = backends;
    if (backends.nccl) mine.gpu = detail::gpu_identity(backends.cuda_device);
  } catch (const std::exception& e) {
    mine = detail::Offer{};
    mine.error = detail::message_of(e);
  }
  offer = detail::encode(mine);
}

}  // namespace fogo::dist

#pragma once
// fogo::dist's process group: where this process sits in the job (the variables torchrun sets),
// which backends it uses, and the group itself. Part of fogo/distributed.h.

#ifndef FOGO_WITH_DISTRIBUTED
#error \
    "fogo was built without distributed support (FOGO_WITH_DISTRIBUTED=OFF or gloo's headers missing)"
#endif

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fogo::dist {

enum class Backend {
  Auto,  ///< Gloo for CPU tensors, plus NCCL for CUDA tensors where the job has them (below)
  Gloo,  ///< Gloo only (CPU tensors)
  Nccl,  ///< NCCL only (CUDA tensors; the device is cuda:LOCAL_RANK)
};

struct ProcessGroupOptions {
  ProcessGroupOptions() = default;
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// Where the job's tensors (gradients, parameters) live; decides Backend::Auto's choice
  /// (choose_backends): a CPU job communicates through Gloo alone, whatever GPUs the machine
  /// has; a CUDA job adds NCCL on cuda:LOCAL_RANK and needs a GPU per local rank. Unset: NCCL is
  /// added only when every local rank of this node has a GPU of its own.
  TORCH_ARG(std::optional<torch::Device>, device) = std::nullopt;
  /// Bounds every wait: reaching the store, the other ranks joining, each collective, shutdown.
  /// (Ranks other than 0 give rank 0 five more seconds to report a rank that did not join.)
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
  /// Used instead of MASTER_ADDR / MASTER_PORT when set.
  TORCH_ARG(std::optional<std::string>, master_addr) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, master_port) = std::nullopt;
};

/// Where this process sits in the job and where the rendezvous store is.
struct Launch {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  /// Ranks on this node (torchrun's LOCAL_WORLD_SIZE); 0: not known, LOCAL_RANK + 1 assumed.
  int64_t local_world_size = 0;
  std::string master_addr;
  int64_t master_port = 0;
  /// torchrun's agent already hosts the store at MASTER_ADDR:MASTER_PORT
  /// (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects to it; otherwise rank 0 hosts it.
  bool agent_store = false;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (optional), MASTER_ADDR, MASTER_PORT (the
  /// last two unless `options` overrides them) and TORCHELASTIC_USE_AGENT_STORE. A variable that is
  /// missing or invalid is a c10::Error naming it.
  static Launch from_env(const ProcessGroupOptions& options = {});
};

/// The backends a group creates.
struct Backends {
  bool gloo = false;
  bool nccl = false;
};

/// What a group of `options` on this rank of `launch` creates, on a node with `cuda_devices`
/// visible GPUs, where fogo was built with NCCL or not (`nccl_built`): Gloo for CPU tensors; NCCL
/// only for a job whose tensors are on CUDA (or, with no device given, when every local rank of
/// the node has a GPU of its own), never for a CPU job. A CUDA job (or Backend::Nccl) with more
/// local ranks than GPUs is a c10::Error naming the fix. Pure: the constructor calls it with
/// this machine's figures; tests inject them.
Backends choose_backends(const ProcessGroupOptions& options, const Launch& launch,
                         int64_t cuda_devices, bool nccl_built);

/// A c10d process group with its TCPStore. A handle: copies share one group, which is shut down
/// when the last copy goes (or by shutdown()). Creating one is collective: every rank of the job
/// must create its groups in the same order.
class ProcessGroup {
 public:
  /// Connects to (rank 0: hosts) the store, checks that the ranks agree (every rank present
  /// within the timeout, one process per rank, the same WORLD_SIZE everywhere) and connects the
  /// backends. Each problem is a c10::Error naming it.
  explicit ProcessGroup(const Launch& launch, ProcessGroupOptions options = {});

  int64_t rank() const;
  int64_t world_size() const;
  int64_t local_rank() const;
  const ProcessGroupOptions& options() const;
  /// The device collectives of fogo's own bookkeeping (checksums, used-gradient counts) use:
  /// the CPU when the group has Gloo, else cuda:LOCAL_RANK.
  torch::Device control_device() const;

  /// The underlying c10d group, for collectives fogo does not wrap (include c10d's
  /// ProcessGroup.hpp to use it).
  c10d::ProcessGroup& c10d() const;

  /// Returns once every rank has called it; a rank missing past the timeout is an error.
  void barrier() const;

  /// Releases the backends and the store. Rank 0, when it hosts the store, first waits (within
  /// the timeout) until every rank has reached shutdown, so that no rank loses the store while
  /// still using it; after a failed collective it does not wait. Idempotent; never throws.
  void shutdown() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend Impl& impl(const ProcessGroup& group);
};

/// ProcessGroup(Launch::from_env(options), options).
ProcessGroup init_from_env(ProcessGroupOptions options = {});

}  // namespace fogo::dist

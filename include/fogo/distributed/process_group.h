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
  Auto,  ///< Gloo, plus NCCL for CUDA tensors where the job has a GPU per rank (below)
  Gloo,  ///< Gloo only: CPU tensors, and CUDA tensors through host memory (slower than NCCL)
  Nccl,  ///< NCCL only (CUDA tensors, on the rank's GPU: ProcessGroup::cuda_device())
};

struct ProcessGroupOptions {
  ProcessGroupOptions() = default;
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// Where the job's tensors (gradients, parameters) live; decides Backend::Auto's choice
  /// (choose_backends): a CPU job communicates through Gloo alone, whatever GPUs the machine
  /// has; a CUDA job adds NCCL on the rank's GPU and needs a GPU of its own for every rank (an
  /// index, cuda:k, names that GPU). Unset: NCCL is added only when every rank of the job has a
  /// GPU of its own.
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
  /// (TORCHELASTIC_USE_AGENT_STORE=True, and the options do not move the endpoint): every rank
  /// connects to it; otherwise rank 0 hosts it.
  bool agent_store = false;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (optional), MASTER_ADDR, MASTER_PORT (the
  /// last two unless `options` overrides them) and TORCHELASTIC_USE_AGENT_STORE. A variable that is
  /// missing or invalid is a c10::Error naming it.
  static Launch from_env(const ProcessGroupOptions& options = {});
};

/// The backends a group creates.
struct Backends {
  /// Gloo: CPU tensors, and CUDA tensors (through host memory) in a group without NCCL.
  bool gloo = false;
  /// NCCL, for CUDA tensors, on `cuda_device`.
  bool nccl = false;
  /// This rank's GPU (an index among the devices the process sees), -1 for none: the index
  /// ProcessGroupOptions::device names; else 0 when the process sees exactly one GPU (a launcher
  /// that gives each rank its own through CUDA_VISIBLE_DEVICES, as SLURM does); else LOCAL_RANK
  /// when the process sees the node's GPUs and there is one for it.
  int64_t cuda_device = -1;
  /// Backend::Auto with no device given: `nccl` is this rank's offer, and the job takes NCCL only
  /// when every rank offers a GPU and no two ranks share one (checked at start-up, the same
  /// answer on every rank); otherwise Gloo alone.
  bool nccl_optional = false;
};

/// What a group of `options` on this rank of `launch` creates, where the process sees
/// `cuda_devices` GPUs and fogo was built with NCCL or not (`nccl_built`): Gloo, unless
/// Backend::Nccl; NCCL only for a job whose tensors are on CUDA (or, with no device given, as an
/// offer the job settles, above), never for a CPU job. A CUDA job (or Backend::Nccl) on a rank
/// without a GPU of its own is a c10::Error naming the fixes. Pure: the constructor calls it with
/// this machine's figures; tests inject them. At start-up the ranks also check that no two of
/// them run NCCL on one GPU (an error naming them).
Backends choose_backends(const ProcessGroupOptions& options, const Launch& launch,
                         int64_t cuda_devices, bool nccl_built);

/// Whether this fogo was built with NCCL (FOGO_DISTRIBUTED_NCCL).
bool built_with_nccl();

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
  /// the CPU when the group has Gloo, else the rank's GPU.
  torch::Device control_device() const;
  /// This rank's GPU (Backends::cuda_device), where a CUDA job keeps its tensors and NCCL runs:
  /// cuda:0 when the process sees one GPU, cuda:LOCAL_RANK when it sees the node's; none when
  /// the rank has no GPU of its own.
  std::optional<torch::Device> cuda_device() const;
  /// Whether CUDA tensors go through NCCL (else through Gloo, by host memory).
  bool has_nccl() const;

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

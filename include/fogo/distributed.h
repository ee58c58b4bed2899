#pragma once
// Data-parallel training on c10d, PyTorch's collective library (it ships in the torch wheel):
// a process group made from what `torchrun` puts in the environment, gradient averaging that any
// LibTorch training loop can call, and checks that replicated ranks stay identical.
//
//   auto group = fogo::dist::init_from_env(                    // RANK, WORLD_SIZE, MASTER_ADDR...
//       fogo::dist::ProcessGroupOptions().device(device));     // the job's device: its backends
//   fogo::dist::broadcast_parameters(group, *model);           // every rank starts from rank 0's
//   fogo::dist::GradientAverager averager(group, model->parameters());
//   for (...) {
//     {
//       auto guard = averager.no_sync();                       // accumulation: no communication
//       loss(micro_batch_0).backward();
//     }
//     loss(micro_batch_1).backward();                          // buckets all-reduce as they fill
//     averager.finish();                                       // grad = sum over ranks / world
//     optimizer.step();                                        // replicated: the same on
//     optimizer.zero_grad();                                   // every rank
//     if (step % 100 == 0) {
//       fogo::dist::check_lockstep(group, fogo::dist::module_state(*model));
//     }
//   }
//
// Every wait is bounded by ProcessGroupOptions::timeout: a rank that dies or stalls makes the
// others fail with a c10::Error instead of hanging. docs/distributed.md has the details.

#ifndef FOGO_WITH_DISTRIBUTED
#error \
    "fogo was built without distributed support (FOGO_WITH_DISTRIBUTED=OFF or gloo's headers missing)"
#endif

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fogo {
class FOGO;
}  // namespace fogo

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

struct GradientAveragerOptions {
  GradientAveragerOptions() = default;
  /// A bucket is closed once it holds at least this many bytes of gradients (DDP's default).
  TORCH_ARG(int64_t, bucket_bytes) = 25 * 1024 * 1024;
};

/// Averages the gradients of `params` over the ranks of a group: grad = (sum over ranks) / world.
///
/// Parameters are bucketed in reverse order (roughly the order backward produces their
/// gradients, as DDP does), by device and dtype, `bucket_bytes` per bucket. A hook on each
/// parameter's gradient accumulator marks it ready as backward accumulates its gradient; a bucket
/// whose parameters are all ready is copied into one flat buffer and all-reduced at once, while
/// backward goes on. finish() all-reduces what backward left (buckets with parameters that got no
/// gradient), waits for everything, and writes the averages back into the `.grad`s.
///
/// Parameters without a gradient: a parameter whose `.grad` is undefined on every rank stays
/// without gradient. If it is defined on some ranks only, the others count as zeros and every
/// rank receives (sum of the defined ones) / world. The counts come from one small extra
/// all-reduce per finish() (an int32 per parameter).
///
/// Gradient accumulation: backward passes inside a no_sync() scope only accumulate locally; the
/// next backward outside one then reduces the accumulated sums. Averaging is over ranks, not over
/// micro-batches: scale the loss by 1 / micro-batches for a mean.
///
/// Why not c10d's Reducer, which ships in the wheel: it expects to be driven the way Python's
/// DistributedDataParallel drives it (prepare_for_forward/backward each step, bucket rebuilding,
/// a Logger; errors phrased for DDP), and it finds unused parameters by walking the autograd
/// graph from the outputs on every step. Hooks on the gradient accumulators need neither the
/// outputs nor a graph walk, and their whole behaviour is what this comment states.
class GradientAverager {
 public:
  /// Parameters that do not require grad are skipped. Collective: checks that every rank passes
  /// the same number of parameters with the same shapes and dtypes.
  GradientAverager(ProcessGroup group, const std::vector<torch::Tensor>& params,
                   GradientAveragerOptions options = {});
  /// The module's parameters, named in errors as named_parameters() names them ("2.weight").
  GradientAverager(ProcessGroup group, const torch::nn::Module& module,
                   GradientAveragerOptions options = {});
  ~GradientAverager();
  GradientAverager(GradientAverager&&) noexcept;
  GradientAverager& operator=(GradientAverager&&) noexcept;

  /// Completes the averaging of this step's gradients; call it on every rank after the last
  /// backward and before the optimizer step. A failed or timed-out all-reduce (another rank died
  /// or stalled) is a c10::Error naming the bucket.
  void finish();

  /// While it lives, backward passes accumulate gradients without communicating.
  class [[nodiscard]] NoSync {
   public:
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    friend class GradientAverager;
    explicit NoSync(GradientAverager& averager);
    GradientAverager& averager_;
    bool previous_;
  };
  NoSync no_sync();

  /// Indices into the constructor's parameters (those requiring grad), per bucket, in the order
  /// the buckets are all-reduced.
  std::vector<std::vector<size_t>> buckets() const;
  /// Buckets whose all-reduce has started since the last finish(); read during backward (from a
  /// tensor hook) it shows how much communication overlaps the rest of backward.
  size_t buckets_started() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

/// Copies root's values of `tensors` into every rank's (in place, without autograd). Collective;
/// the tensors must have the same shapes and dtypes on every rank (checked).
void broadcast_tensors(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                       int64_t root = 0);
/// broadcast_tensors of a module's parameters and buffers: every rank starts from root's model.
void broadcast_parameters(const ProcessGroup& group, const torch::nn::Module& module,
                          int64_t root = 0);

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// A module's parameters and buffers by name.
NamedTensors module_state(const torch::nn::Module& module);
/// FOGO's memory (FOGO::memory) by name: "fogo.group<g>.centroids", ".S", ".N", ".frozen",
/// ".frozen_nu" (those that exist yet).
NamedTensors fogo_memory(const fogo::FOGO& optimizer);

/// Checks that every rank holds bit-identical `tensors`: a checksum of each tensor's bytes
/// (exact integer sums, the same on every device) is gathered from all ranks. A difference is a
/// c10::Error on every rank naming the first tensor that differs and the ranks that disagree
/// with rank 0. Collective; run it every N steps in replicated training.
void check_lockstep(const ProcessGroup& group, const NamedTensors& tensors);

/// The cost sharded mode balances: m·n·min(m, n) for a parameter viewed as an m×n matrix (its
/// first dimension by the rest), proportional to Newton–Schulz's flops; numel for vectors.
double newton_schulz_cost(const torch::Tensor& param);

/// Sharded optimizer mode, for optimizers whose update of a parameter depends only on that
/// parameter's gradient and state: fogo::Muon, and LibTorch's SGD, Adam, AdamW. Each parameter is
/// owned by one rank (greedy: costliest first, to the least-loaded rank; the same assignment on
/// every rank); each rank's own optimizer, made by `make` from its owned parameters, holds only
/// their state and steps only them (Muon: each Newton–Schulz runs once in the job instead of on
/// every rank), then every parameter is broadcast from its owner. On averaged gradients the
/// parameters are bit-identical to the replicated mode's whenever the optimizer's arithmetic on a
/// parameter does not depend on which other parameters it steps with (tested for fogo::Muon).
///
/// Checkpoints do not depend on the world size: save() writes what `make(all parameters)`'s
/// own save() would write after the same steps (every parameter's state from its owner, the
/// param groups' options from this rank's optimizer), so a job of any world size, or one process
/// with a plain optimizer, can load it.
///
/// Not for fogo::FOGO: its codebook is shared by the parameters of a group, so a shard would
/// read and update its own memory; FOGO shards its step with shard_step.
class ShardedOptimizer {
 public:
  using Factory =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> owned)>;
  using Cost = std::function<double(const torch::Tensor&)>;

  /// Collective: checks that every rank passes the same shapes and dtypes. `make` is called
  /// on ranks that own at least one parameter, and by save() and load(); it must make one
  /// optimizer type with the same param-group layout whatever subset it is given.
  ShardedOptimizer(ProcessGroup group, std::vector<torch::Tensor> params, Factory make,
                   const Cost& cost = newton_schulz_cost);

  /// This rank's optimizer step on its parameters, then every parameter from its owner (one
  /// broadcast per rank, device and dtype). Collective.
  void step();
  /// Zeroes (sets to none) the gradients of every parameter, owned or not.
  void zero_grad();

  /// Writes the whole optimizer, gathered from every rank, into `archive` (on every rank; save
  /// it to a file from one). Collective.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Loads an archive of save() (from any world size) or of the plain optimizer's save() on
  /// every rank; each rank keeps the state of its own parameters. Not collective. Errors (an
  /// archive of another optimizer or another parameter layout) leave this optimizer as it was.
  void load(torch::serialize::InputArchive& archive);

  /// The owner of each parameter (indices as passed).
  const std::vector<int64_t>& owners() const { return owners_; }
  /// This rank's optimizer; nullptr when it owns nothing.
  torch::optim::Optimizer* local() const { return local_.get(); }

 private:
  std::vector<torch::Tensor> owned_by(int64_t rank) const;
  ProcessGroup group_;
  std::vector<torch::Tensor> params_;
  Factory make_;
  std::vector<int64_t> owners_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

/// Sharded step of fogo's matrix optimizers, with the optimizer's state kept on every rank:
/// each parameter's expensive work runs on one owner rank (greedy by `cost`, as
/// ShardedOptimizer) and the results are broadcast from the owners (step_shard.h).
///
/// fogo::FOGO (FOGO::set_step_shard): Newton–Schulz (both streams) and the projection (steps
/// 2-3), the lift and the update (steps 8-9) on the owner. P_s and P_f are broadcast after step 3,
/// so that the projected-space step and the codebook update (steps 4-7, the flush) run on every
/// rank over all rows; the updated parameters after step 9. Codebooks, statistics, telemetry and
/// parameters stay bit-identical to the replicated mode's (tested) with no reduction of m_j, s_j
/// or r_t.
/// fogo::Muon (Muon::set_step_shard): Newton–Schulz and the update on the owner, the
/// parameters broadcast at the end of the step.
/// A HybridOptimizer: its matrix side, as above (the AdamW side stays replicated: it is cheap).
///
/// Momenta stay on every rank, so checkpoints do not depend on the world size (for Muon,
/// ShardedOptimizer also shards the state). Collective: every rank calls it for its optimizer,
/// with the same parameters in the same order; call it again after add_param_group or a load()
/// that brings other parameters. Returns the owner of each parameter (param groups in order).
/// The optimizer keeps a copy of `group` for its steps. Another optimizer type is an error.
std::vector<int64_t> shard_step(const ProcessGroup& group, torch::optim::Optimizer& optimizer,
                                const ShardedOptimizer::Cost& cost = newton_schulz_cost);

}  // namespace fogo::dist

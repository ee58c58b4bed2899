#pragma once
// Data-parallel training for the example trainers, on fogo::dist (docs/distributed.md): the
// process's place in a torchrun job, gradient averaging, and the few collectives a trainer needs
// (sums of losses, rank 0's checkpoint bytes, the lockstep check). A process that torchrun did not
// start (WORLD_SIZE unset or 1) is a world of one: every call is then a no-op and the trainer
// runs exactly as a single process.
//
//   auto& dp = DataParallel::process();          // once per process; collective when WORLD_SIZE >
//   1 dp.broadcast_module(*model);                 // every rank starts from rank 0's weights
//   dp.average_gradients_of(*model);
//   for (...) {
//     dp.accumulate_locally([&] { loss0.backward(); });   // no communication
//     loss1.backward();                                    // buckets all-reduce during backward
//     dp.finish_gradients();                              // grad = mean over ranks
//     optimizer.step();                                   // replicated: the same on every rank
//   }
//   DataParallel::shutdown_process();            // at the end of main

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace fogo {
class FOGO;
}

namespace fogo::trainer {

class Cli;
class RunSignature;

/// The data-parallel settings both trainers take (under torchrun).
struct DataParallelFlags {
  bool shard_step = false;     ///< fogo::dist::shard_step on the optimizer's matrix side
  int64_t dist_timeout = 600;  ///< seconds a collective waits for the other ranks
};
/// Registers --shard-step and --dist-timeout; validate_data_parallel_flags() checks them.
void add_data_parallel_flags(Cli& cli, DataParallelFlags& flags);
/// Throws a CliError naming the flag.
void validate_data_parallel_flags(const DataParallelFlags& flags);

class DataParallel {
 public:
  /// This process's place, made on first call from the environment torchrun sets (RANK,
  /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): a process group when WORLD_SIZE > 1, else
  /// a world of one. `device` is where the job trains (the trainers' --device): a CPU job
  /// communicates through Gloo whatever GPUs the machine has; a CUDA job adds NCCL and needs a GPU
  /// per local rank (fogo::dist::choose_backends). Throws naming the variable when the
  /// environment is malformed, and when WORLD_SIZE > 1 but fogo was built without distributed
  /// support. The group lives until shutdown_process(). `timeout` bounds every collective (a rank
  /// that died or stalls makes the others fail after it); the first call's arguments count.
  static DataParallel& process(std::chrono::seconds timeout = std::chrono::minutes(10),
                               std::optional<torch::Device> device = std::nullopt);
  /// Shuts the process's group down (every rank waits for the others to arrive); idempotent.
  static void shutdown_process();

  /// A world of one (no communication).
  DataParallel();

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  int64_t local_rank() const { return local_rank_; }
  /// The GPU the job's process group settled on for this rank (cuda:0 when the rank sees one GPU,
  /// else cuda:LOCAL_RANK; ProcessGroup::cuda_device); none in a world of one or a CPU job.
  std::optional<torch::Device> cuda_device() const { return cuda_device_; }
  bool distributed() const { return world_size_ > 1; }
  /// Rank 0: the one that logs, writes metrics, plots and checkpoints.
  bool main() const { return rank_ == 0; }
  /// `out` on rank 0; on the other ranks a stream that discards what is written to it.
  std::ostream& main_only(std::ostream& out) const;

  /// Returns once every rank has called it.
  void barrier() const;
  /// Every rank gets rank 0's parameters and buffers.
  void broadcast_module(const torch::nn::Module& module) const;
  /// Every rank gets rank 0's buffers (BatchNorm's running statistics, which each rank updates
  /// from its own batch: what PyTorch's DistributedDataParallel does before every forward).
  void broadcast_buffers(const torch::nn::Module& module) const;
  /// Averages the gradients of `module`'s parameters over the ranks from now on (bucketed
  /// all-reduce during backward); replaces any module given before.
  void average_gradients_of(const torch::nn::Module& module);
  /// Runs `backward` (one or more backward passes) without communicating: gradient accumulation
  /// of every micro-batch but the last.
  void accumulate_locally(const std::function<void()>& backward);
  /// Completes the averaging: every gradient = (sum over ranks) / world_size.
  void finish_gradients();
  /// Shards the matrix side of `optimizer` (fogo::FOGO, fogo::Muon, or a hybrid of either) over
  /// the ranks: each rank runs the Newton–Schulz chains (and FOGO's projection, lift and update)
  /// of its share of the matrices, and the results are broadcast (fogo::dist::shard_step). The
  /// step's results are bit-identical to the replicated step's. Returns the owner rank of each
  /// matrix; in a world of one, does nothing and returns none.
  std::vector<int64_t> shard_step(torch::optim::Optimizer& optimizer) const;
  /// The sum over ranks of `values` (a CPU tensor), returned on every rank.
  torch::Tensor sum(const torch::Tensor& values) const;
  double sum(double value) const;
  /// Replaces `values` by its sum over the ranks, on its own device (NCCL for CUDA tensors
  /// when fogo has it).
  void sum_in_place(torch::Tensor& values) const;
  /// Rank 0's `values` on every rank (the other ranks' arguments are ignored).
  std::vector<double> from_main(const std::vector<double>& values) const;
  /// This rank's share [begin, end) of `n` rows split over the ranks in rank order (rank r:
  /// [r n / W, (r + 1) n / W)); every rank's share is non-empty when n >= world_size().
  std::pair<int64_t, int64_t> rows(int64_t n) const;
  /// The rows of every rank in rank order: `local` is this rank's share rows(n) of an [n, ...]
  /// tensor; the result, the whole tensor, is bit-identical on every rank (same device and dtype
  /// as `local`).
  torch::Tensor gather_rows(const torch::Tensor& local, int64_t n) const;
  /// The contents of `path` as rank 0 sees it, on every rank (nullopt everywhere when it does not
  /// exist on rank 0): checkpoints need to exist only where rank 0 runs.
  std::optional<std::string> read_on_main(const std::string& path) const;
  /// At start-up: throws a CliError on every rank, naming each flag and both values, when a rank
  /// was launched with other `settings` than rank 0 (the run signature and the flags every rank
  /// must share), instead of training on (a different --data-seed) or failing inside a collective
  /// (a different --eval-every).
  void check_same_settings(const RunSignature& settings) const;
  /// Runs `body` on rank 0 alone; when it throws, every rank throws: rank 0 its own exception,
  /// the others one of the same kind (std::invalid_argument or std::runtime_error) quoting it.
  /// What rank 0 alone does at start-up (claiming --out) then stops the whole job at once.
  void on_main(const std::function<void()>& body) const;
  /// Throws on every rank naming the first tensor that differs between ranks (a replicated run
  /// must keep its model, optimizer state and `extra` bit-identical).
  void check_lockstep(const torch::nn::Module& module, const fogo::FOGO* fogo = nullptr,
                      const std::vector<std::pair<std::string, torch::Tensor>>& extra = {}) const;

  struct Impl;

 private:
  int64_t rank_ = 0, world_size_ = 1, local_rank_ = 0;
  std::optional<torch::Device> cuda_device_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace fogo::trainer

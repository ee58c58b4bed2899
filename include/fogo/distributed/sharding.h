#pragma once
// fogo::dist's sharded optimizer steps: each parameter's expensive work on one owner rank.
// Part of fogo/distributed.h.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "fogo/distributed/process_group.h"

namespace fogo::dist {

/// The cost sharded mode balances: fogo::newton_schulz_cost of the parameter's shape
/// (step_shard.h; owners by fogo::assign_owners).
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
/// parameters broadcast at the end of the step. The unit of work is a matrix of a parameter's
/// matrix view (MatrixOptimizer::matrix_view): a stack of experts (batch_dims) or a fused weight
/// cut in blocks (heads, blocks) is split across owners by matrix, each at `cost` of its view
/// (fogo::matrix_of: [rows, in...]).
/// A HybridOptimizer: its matrix side, as above (the AdamW side stays replicated: it is cheap).
///
/// Momenta stay on every rank, so checkpoints do not depend on the world size (for Muon,
/// ShardedOptimizer also shards the state). Collective: every rank calls it for its optimizer,
/// with the same parameters in the same order; call it again after add_param_group or a load()
/// that brings other parameters (or a change of a group's batch_dims, heads or blocks). Returns
/// the owner of each matrix: the parameters in param-group order, each one's matrices in order
/// (one per parameter where nothing cuts it into several).
/// The optimizer keeps a copy of `group` for its steps. Another optimizer type is an error.
std::vector<int64_t> shard_step(const ProcessGroup& group, torch::optim::Optimizer& optimizer,
                                const ShardedOptimizer::Cost& cost = newton_schulz_cost);

}  // namespace fogo::dist

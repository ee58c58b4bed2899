#pragma once
// The data-parallel sharding hook of fogo's matrix optimizers (fogo::FOGO, fogo::Muon):
// fogo::dist::shard_step installs it; without it (the default) an optimizer steps every
// parameter itself.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace fogo {

/// One unit of a sharded step's work: matrix `matrix` of `param`'s matrix view (matrix_view.h;
/// MatrixOptimizer::matrix_view), 0 for a parameter that is one matrix.
struct ShardUnit {
  torch::Tensor param;
  int64_t matrix = 0;
};

/// Which matrices this rank runs the per-matrix work for, and how the other ranks' results arrive.
/// `exchange(units, values)` must overwrite values[i] (a list of tensors) with their values on
/// units[i]'s owner, on every rank that does not own units[i]; every rank calls it at the same
/// points of a step with the same units (a collective). What is exchanged is the optimizer's to
/// say (FOGO::set_step_shard, Muon::set_step_shard).
struct StepShard {
  std::function<bool(const torch::Tensor& param, int64_t matrix)> owns;
  std::function<void(const std::vector<ShardUnit>& units,
                     const std::vector<std::vector<torch::Tensor>>& values)>
      exchange;

  /// Both functions set: sharded; neither: not sharded; anything else is an error naming
  /// `optimizer`.
  bool enabled(const char* optimizer) const;
};

/// The cost sharded steps balance for a parameter of shape `sizes`: m·n·min(m, n) for its m×n
/// matrix view (its first dimension by the rest), proportional to Newton–Schulz's flops; numel
/// for a vector or scalar.
double newton_schulz_cost(at::IntArrayRef sizes);

/// Each parameter's owner rank among `world`, by `costs` (one per parameter): greedy, costliest
/// first (ties: the earlier parameter) to the least-loaded rank (ties: the lower rank). Only the
/// costs enter, so every rank computes the same owners. Used by fogo::dist's sharded steps and by
/// Python's owner-computes for FSDP2 (python/fogo/optim.py).
std::vector<int64_t> assign_owners(const std::vector<double>& costs, int64_t world);

}  // namespace fogo

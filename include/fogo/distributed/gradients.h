#pragma once
// fogo::dist's gradient averaging over a process group. Part of fogo/distributed.h.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fogo/distributed/process_group.h"

namespace fogo::dist {

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

}  // namespace fogo::dist

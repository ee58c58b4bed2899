#pragma once
// The stages of FOGO's step for one param group, as FOGO::device_step calls them in
// docs/algorithm.md's order (private to src/; the benchmark's stage breakdown calls them too, so
// that it times what the optimizer runs). Each takes the group's parameters in the working
// orientation (Work), in runs of one shape that go through Newton–Schulz, the projection and the
// lift as one batch.
#include <ATen/ATen.h>
#include <fogo/device_step.h>

#include <functional>
#include <utility>
#include <vector>

#include "fogo/fogo_optimizer.h"
#include "fogo_private/fogo/projected.h"
#include "fogo_private/fogo/state.h"
#include "fogo_private/frame/batching.h"
#include "fogo_private/frame/nonfinite.h"

namespace fogo {

/// The projected-space stages' parameters (docs/algorithm.md steps 4-7) from a group's options;
/// `filter` is false on a group's first step.
ProjectedStepParams projected_step_params(const FOGOOptions& o, bool filter);

}  // namespace fogo

namespace fogo::stages {

/// One matrix in the working orientation [m, n], m <= n (the projected side n is the larger one;
/// docs/algorithm.md "Shapes"): a parameter's matrix view, or one matrix of it (a stack's expert, a
/// block of a fused weight: matrix_view.h), every tensor below a view of the parameter's.
struct Work {
  at::Tensor param;
  at::Tensor whole;    ///< the parameter `param` is a matrix of
  int64_t matrix = 0;  ///< which matrix of whole's matrix view
  bool transposed;
  int64_t m, n;
  at::Tensor slow, fast;  ///< the momenta B_s, B_f (state, in the parameter's shape)
  at::Tensor G;           ///< the gradient in fp32
  /// O_s, the orthogonalized slow stream in the NS compute dtype (the fast one is only ever
  /// projected)
  at::Tensor Os;
  const Projection* proj;  ///< none for fusion_only (Pi is never built)
  at::Tensor v;            ///< NorMuon's second moment (state), or undefined with normuon off
};

/// [begin, end) of each run of same-shape parameters in a list of Work
/// (fogo_private/frame/batching.h).
using ShapeRuns = detail::Runs;

using ParamStates = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

/// Every matrix (of the group's `layout`) with elements of every parameter (with a gradient): its
/// momenta (created in `state` on the parameter's first step; with `normuon` its second moment
/// too), fp32 gradient, working orientation and projection (`projection(n)` when given), sorted
/// into runs of one shape; `runs` receives them.
std::vector<Work> working_set(const std::vector<at::Tensor>& params,
                              const std::vector<at::Tensor>& grads, ParamStates& state,
                              const std::function<const Projection&(int64_t n)>& projection,
                              const MatrixLayout& layout, bool normuon, ShapeRuns& runs);

/// NorMuon's second moment (zeros of `p`'s leading batch_dims + 1 dimensions: one per row of
/// each of its matrices; normuon_dtype) for each of `params` whose state exists without one.
void add_second_moments(ParamStates& state, const std::vector<at::Tensor>& params,
                        const MatrixLayout& layout);

/// The parameters this rank steps through the per-parameter stages (2-3, 8-9), and the exchange
/// hook that brings the others' results from their owners: under data-parallel sharding
/// (StepShard) the owned ones, else all of them with every exchange the identity.
class Sharing {
 public:
  Sharing(const std::vector<Work>& work, const ShapeRuns& runs, const StepShard& shard);
  std::vector<Work>& work() { return mine_; }
  const std::vector<Work>& work() const { return mine_; }
  const ShapeRuns& runs() const { return runs_; }
  /// Index into the group's work of each of this rank's parameters.
  const std::vector<size_t>& index() const { return index_; }
  /// This rank's (P_s, P_f) rows -> every parameter's, in the group's row order.
  std::pair<at::Tensor, at::Tensor> projections(std::pair<at::Tensor, at::Tensor> mine,
                                                const FOGOOptions& o) const;
  /// The rows of the group's R-row `dz` that belong to this rank's parameters, in its order.
  at::Tensor rows(const at::Tensor& dz) const;
  /// This rank's parameters and delta ratios -> every parameter (the parameters updated in place)
  /// and the group's ratios in its order.
  std::vector<at::Tensor> updates(std::vector<at::Tensor> ratios) const;

 private:
  const std::vector<Work>& group_;
  const StepShard& shard_;
  std::vector<Work> mine_;
  ShapeRuns runs_;
  std::vector<size_t> index_;
  std::vector<int64_t> row_;  ///< first row of each group parameter in the [R, d] matrices
};

/// The inputs of step 2's chains, one [2P, m, n] per run of the share in the NS compute dtype: the
/// P slow streams, then the P fast ones (written by step 1).
std::vector<at::Tensor> ns_inputs(const Sharing& share, const FOGOOptions& o);

/// Step 1: both momenta of every parameter of the group, and the share's NS inputs in the same
/// pass (ops::momenta_step: one launch per group on CUDA). `ok` (Mask): where false, nothing.
void update_momenta(const std::vector<Work>& work, const Sharing& share,
                    const std::vector<at::Tensor>& inputs, const FOGOOptions& o,
                    const at::Tensor& ok);

/// Step 2's route for the fast stream of a run (NS inputs Bf [P, m, n]): the Gram route, P_f from
/// Gram iterations with its projection (fewer multiply-adds; with bf16/fp16 compute only when
/// ns_form lets it in, with restarts: without them the Gram matrix squares the conditioning and low
/// precision loses the small directions), or the plain chain then the projection. ns_form Auto:
/// timed at the first sight of the shape (GPU and CPU); otherwise the cost model.
bool fast_stream_takes_gram(const at::Tensor& Bf, const Projection& proj, const FOGOOptions& o);

/// Step 3 for a run: the rows of O [P, m, n] times Pi into `out` [P m, d] fp32. With unit-scale Pi
/// (entries +-1, exact in bf16) a bf16 O times Pi is exact products summed in fp32 (mm_bf16_f32:
/// tensor cores on CUDA, the same result up to summation order).
void project_rows(const at::Tensor& O, const Projection& proj, at::Tensor& out);

/// Step 2 for one run, `input` [2P, m, n] (the P slow streams, then the P fast ones): O_s [P, m,
/// n], and O_f [P, m, n] or, with `gram` (fast_stream_takes_gram; its projection), P_f [P m, d]
/// from the Gram route. Both streams go through one chain when they take the same route and
/// number of steps.
struct RunStreams {
  at::Tensor Os, Of, Pf;
};
RunStreams orthogonalize_run(const at::Tensor& input, const Projection* gram, const FOGOOptions& o);

/// The dtype the group's Newton–Schulz computes in on `device`: ns_dtype, auto resolved
/// (ns_dtype.h).
at::ScalarType compute_dtype(const FOGOOptions& o, const c10::Device& device);

/// Step 8's lift matrix K of `proj` at the step's precision (bf16 products when NS computes in
/// bf16).
const at::Tensor& lift_matrix(const Projection& proj, const FOGOOptions& o);

/// Steps 2 and 3 for the share: O_s = NS(B_s) (kept in each Work), and P_s = O_s Pi, P_f = O_f Pi
/// [R, d] fp32 with the rows in the share's order; the fast stream through the Gram route with
/// its projection when that is cheaper (P_f without forming O_f).
std::pair<at::Tensor, at::Tensor> orthogonalize_and_project(std::vector<Work>& work,
                                                            const ShapeRuns& runs,
                                                            const std::vector<at::Tensor>& inputs,
                                                            const FOGOOptions& o);

/// A group's first step: the codebook from that step's queries (docs/algorithm.md "First step").
void initialize_memory(GroupMemory& mem, const at::Tensor& Ps, const at::Tensor& Pf,
                       const FOGOOptions& o);

/// The keys of this step's draw of long-term candidates (step 7), from the group's CPU generator
/// before any device work: undefined when the step protects against the whole frozen bank.
at::Tensor draw_candidate_keys(GroupMemory& mem, const FOGOOptions& o, const c10::Device& device);

/// A_t: the frozen centroids (and weights) this step protects against (step 7).
std::pair<at::Tensor, at::Tensor> long_term_candidates(const GroupMemory& mem, const FOGOOptions& o,
                                                       const at::Tensor& keys);

/// Steps 8 and 9 for the share: the proximal lift of its rows of dz and the RMS update with `lr`
/// (the step's: o.lr(), or a CUDA graph's on the device); |delta|_F / |O_s|_F of each parameter.
/// `ok` (Mask): where false, the parameters keep their values.
std::vector<at::Tensor> lift_and_update(const std::vector<Work>& work, const ShapeRuns& runs,
                                        const at::Tensor& dz, const FOGOOptions& o,
                                        const LearningRate& lr, const at::Tensor& ok);

/// fusion_only: steps 2, 4 and 9 in parameter space; nothing is projected, remembered or filtered.
std::vector<at::Tensor> fuse_and_update(const std::vector<Work>& work, const ShapeRuns& runs,
                                        const std::vector<at::Tensor>& inputs, const FOGOOptions& o,
                                        const LearningRate& lr, const at::Tensor& ok);

/// The codebook flush after the group has stepped, then re-seeding when `reseed_now`.
void flush_and_reseed(GroupMemory& mem, const ProjectedStepResult& r, const FOGOOptions& o,
                      bool reseed_now);

/// The step's statistics, kept on the device (FOGO::telemetry() reads them back).
void record_telemetry(GroupMemory& mem, const ProjectedStepResult& r,
                      const std::vector<at::Tensor>& delta_ratios, const FOGOOptions& o);

/// Mask, on the host before a step: the device counters a masked step updates, and how
/// consolidate() will know whether it has something new to freeze.
void prepare_mask_state(GroupMemory& mem, const at::Tensor& ok);

/// Mask, around a step's device work: the memory a step changes is copied before it (the tensors
/// of GroupMemory::visit marked kMasked) and put back where `ok` is false after it; the masked
/// step is counted. Nothing without `ok`.
class MaskedMemory {
 public:
  MaskedMemory(GroupMemory& mem, const at::Tensor& ok);
  void restore() const;

 private:
  GroupMemory& mem_;
  at::Tensor ok_;
  detail::MaskScope keep_;
};

}  // namespace fogo::stages

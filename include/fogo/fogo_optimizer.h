#pragma once
// fogo::FOGO, the Forgetting-aware Orthogonalization Optimizer, as read by
// `docs/algorithm.md` (paper: Method section, Appendix "Detailed Algorithm",
// Algorithm 1). Stage by stage, with the paper's symbols:
//
//   streams      B_s = mu_s B_s + G,  B_f = mu_f B_f + G              (step 1)
//   NS           O_s = NS(B_s; K_s),  O_f = NS(B_f; K_f)              (step 2, newton_schulz.h)
//   projection   P_s = O_s Pi,  P_f = O_f Pi                           (step 3, projection.h)
//   slerp        z_i = |P_s,i| Slerp(P_s,i, P_f,i; xi)                 (step 4, projected.h)
//   memory read  q_i, a_i = argmax_j <q_i, cbar_j>, accumulate m_j, s_j (step 5, codebook.h)
//   short-term   z~_i = z_i - gamma_hi z_hi - gamma_st z_conf          (step 6, projected.h)
//   long-term    zbar_i = z~_i - gamma_lt z_lt                         (step 7, projected.h)
//   lift         delta_i = Pi (I + 2 lambda M)^-1 2 lambda (zbar_i - P_s,i)  (step 8)
//   update       theta = (1 - lr wd) theta - lr sigma sqrt(mn)/|Ohat|_F Ohat  (step 9)
//   flush        S_j, N_j EMA, decorrelate, re-seed                    (codebook.h)
//
// Each param group is one codebook group with its own options.

#include <fogo/fogo_options.h>
#include <fogo/matrix_optimizer.h>
#include <fogo/step_shard.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <functional>
#include <tuple>
#include <vector>

namespace fogo {

/// Per-parameter state: the two momentum streams, fp32 whatever the parameter's dtype, in the
/// parameter's shape.
struct FOGOParamState : public torch::optim::OptimizerCloneableParamState<FOGOParamState> {
  TORCH_ARG(torch::Tensor, slow_momentum);  ///< B_s
  TORCH_ARG(torch::Tensor, fast_momentum);  ///< B_f
  /// NorMuon's per-row second moment [size(0)] (FOGOOptions::normuon; fp32, fp64 for an fp64
  /// parameter): undefined while normuon is off.
  TORCH_ARG(torch::Tensor, second_moment);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Both momenta (and second moments) equal (torch::equal), as LibTorch's param states compare.
  friend bool operator==(const FOGOParamState& a, const FOGOParamState& b);
};

// clang-format off
/// FOGO's telemetry, per param group, the one list of it: X(type, name, source, logged).
/// source: Device, a statistic the step records on the device (GroupMemory::stats, in this
/// order; computed in record_telemetry, src/fogo/stages.cpp), or Host, known on the host
/// (computed in FOGO::telemetry). logged: whether the trainers record it each step
/// (examples/common/optimizers.cpp). FOGOTelemetry, telemetry()'s read-back, the trainers'
/// records and Python's telemetry dicts are made from it.
#define FOGO_TELEMETRY(X)                                                                        \
  X(int64_t, step,              Host,   false)  /* the group's step counter */                   \
  X(double,  rbar,              Device, true)   /* conflict EMA */                               \
  X(double,  gamma_st,          Device, true)   /* adaptive short-term strength */               \
  X(double,  frac_conflicting,  Device, true)   /* rows with a non-empty conflicting set C_i */  \
  X(double,  frac_over_aligned, Device, true)   /* rows with a non-empty over-aligned set H_i */ \
  X(double,  frac_lt_protected, Device, true)   /* rows with a non-empty long-term set B_i */    \
  X(double,  codebook_entropy,  Device, true)   /* entropy of N_j / sum N (nats) */              \
  X(int64_t, live_centroids,    Device, true)   /* centroids with N_j >= reseed_threshold */     \
  X(double,  delta_ratio,       Device, true)   /* mean over parameters of |delta|_F/|O_s|_F */  \
  X(int64_t, frozen,            Host,   true)   /* frozen-bank size */                           \
  /* NonFinitePolicy::Mask: steps whose unusable gradients were masked on the device (since      \
     construction or the last load; not checkpointed) */                                          \
  X(int64_t, skipped_steps,     Host,   false)                                                   \
  /* FOGOOptions::cuda_graph: captures of the group's step (the first steady-state step, and     \
     again after what changes its memory layout: a task boundary, a load, other parameters), and \
     steps run from a captured graph (the capturing step included) */                            \
  X(int64_t, graph_captures,    Host,   false)                                                   \
  X(int64_t, graph_replays,     Host,   false)
// clang-format on

/// Per-group statistics of the last step, for a trainer to log (FOGO_TELEMETRY).
struct FOGOTelemetry {
#define FOGO_TELEMETRY_FIELD(T, name, ...) T name = 0;
  FOGO_TELEMETRY(FOGO_TELEMETRY_FIELD)
#undef FOGO_TELEMETRY_FIELD
};

/// The step (step(), step_with()) is MatrixOptimizer's frame (matrix_optimizer.h): everything that
/// can be checked is checked before anything changes (each group's options, parameter shapes and
/// devices, gradient shapes and kinds, NaN/Inf in the gradients under NonFinitePolicy::Raise), so
/// such an error leaves the optimizer and the parameters as they were. FOGO's own part is one
/// param group's step.
class FOGO : public MatrixOptimizerOf<FOGOOptions> {
 public:
  explicit FOGO(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                FOGOOptions defaults = {});
  explicit FOGO(std::vector<torch::Tensor> params, FOGOOptions defaults = {})
      : FOGO({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}
  ~FOGO() override;
  FOGO(FOGO&&) noexcept;
  FOGO& operator=(FOGO&&) noexcept;

  /// End of a task: freeze freeze_per_task centroids of every group, chosen by importance.
  /// Once per task: calling it again before the next step (or task_boundary() after it) adds
  /// nothing, so the same centroids are never frozen twice.
  void consolidate();
  /// Start of a task: momenta and conflict EMA to zero, task-start codebook snapshot.
  void begin_task();
  /// consolidate() then begin_task().
  void task_boundary();

  /// One entry per param group, from the last step: a read, with one device-to-host transfer
  /// for all groups (per device).
  std::vector<FOGOTelemetry> telemetry() const;

  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores momenta, codebooks, EMA statistics, frozen banks, generators and step counters.
  /// The options come from the checkpoint (lr included, as LibTorch's optimizers load), except
  /// that a checkpoint whose memory is laid out differently is rejected: other parameter shapes,
  /// another group layout, or a group with another codebook_size, proj_dim, seed or
  /// projection_scale (its codebook would live in another projected space). A rejected load
  /// leaves this optimizer as it was.
  void load(torch::serialize::InputArchive& archive) override;

  /// The matrices of `param` under group `group`'s batch_dims, heads and blocks (matrix_view.h):
  /// each its own rows in the projected space, as a parameter of its own.
  MatrixView matrix_view(size_t group, const at::Tensor& param) const override;

  /// Not a group's first step: its codebook is built from that step, and there is no earlier
  /// memory to keep (a step that cannot be masked is checked on the host, as Skip).
  bool maskable(size_t g) const override;

  /// A copy of a group's memory, for inspection and tests (writing into it changes nothing):
  /// unit centroids [C, d], the EMA sums S [C, d] and counts N [C] (all undefined before the
  /// group's first step), frozen bank [F, d] and its weights nu [F].
  struct MemoryView {
    torch::Tensor centroids, S, N, frozen, frozen_nu;
  };
  MemoryView memory(size_t group) const;

 private:
  const char* name() const override { return "FOGO"; }
  void check_param(size_t g, size_t i, const at::Tensor& p) const override;
  // The frame's hooks. Data-parallel sharding of the step (set_step_shard; step_shard.h): the
  // per-matrix work runs only on each matrix's owner (a parameter's matrix view, or each matrix
  // of it: matrix_view), for the matrices `owns` accepts: Newton–Schulz and the projection
  // (steps 2-3), the lift and the update (steps 8-9). The step calls `exchange` twice per group
  // with the matrices of its parameters with gradients, in the step's order:
  //   - after step 3, values[i] = {P_s, P_f} ([m, d] fp32): the projected-space step (4-7) and
  //     the codebook flush then run on every rank over all rows, so the codebooks, r-bar and
  //     statistics stay identical with no reduction;
  //   - after step 9, values[i] = {the matrix's view of the parameter, its |delta|_F / |O_s|_F
  //     (0-d fp32)}.
  // Momenta (step 1) are kept for every parameter on every rank, so checkpoints do not depend
  // on the sharding.
  /// The group's memory, its Mask bookkeeping and NorMuon's second moments.
  void create_state(const GroupStep& s) override;
  /// The host's decisions (random draws: the long-term candidates' keys; the re-seeding cadence).
  HostStep prepare_step(const GroupStep& s) override;
  std::vector<at::Tensor> touched(const GroupStep& s) const override;
  /// None: FOGO masks inside its stages (MaskedMemory; its kernels take the flag).
  std::vector<at::Tensor> masked_tensors(const StepInputs& in) const override;
  /// Steps 1-9 and the flush: device work only, every state tensor updated in place. Where in.ok
  /// is false the step leaves every tensor as it was.
  void device_step(const StepInputs& in) override;
  /// The parameters' states, the group's memory and the projections.
  std::function<void()> save_host_state(const GroupStep& s) override;
  /// The group's step counter.
  void finish_group(const GroupStep& s) override;
  /// Nothing: FOGO's exchanges are inside its stages (above).
  void finish_step(const std::vector<GroupStep>& groups) override { (void)groups; }
  bool reseeds_now(size_t g) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(FOGO);
  }
};

}  // namespace fogo

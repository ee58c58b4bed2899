#pragma once
// fogo::Muon: momentum orthogonalized by Newton–Schulz, numerically faithful to PyTorch's
// torch.optim.Muon (same defaults, same math; bit-identical on the CPU, see "Batching" below).
//
// Per parameter with gradient G (PyTorch's algorithm):
//   buf.lerp_(G, 1 - momentum)                      momentum buffer as an EMA
//   U = nesterov ? G.lerp(buf, momentum) : buf
//   O = NS(U)                                         bf16 quintic, 5 steps (newton_schulz.h)
//   p *= 1 - lr * weight_decay                        decoupled, unadjusted lr
//   p -= adjust(lr, A, B) * O                         'original': sqrt(max(1, A/B))
//                                                     'match_rms_adamw': 0.2 sqrt(max(A, B))
//                                                     'spectral' (fogo's): sqrt(A/B)
// Beyond PyTorch: an N-D weight (conv [out, in, kh, kw]) is handled as its [out, in*kh*kw] view
// unless `strict_2d` asks for PyTorch's 2-D-only behaviour; a group's `batch_dims` makes a stack
// [E, out, in] E matrices, its `heads`/`blocks` cut each matrix's rows into blocks, each
// stepped as a parameter of its own shape (matrix_view.h); gradients are checked for NaN/Inf;
// `normuon` replaces O by its rows normalized by their second moments (NorMuon; docs/muon.md).
//
// Batching: within a param group, the momentum and nesterov updates are multi-tensor ops (same
// arithmetic per tensor as PyTorch's per-parameter ops). On a CUDA device all matrices (of the
// parameters' matrix views) that share one shape [A, B] go through ONE batched
// Newton–Schulz chain on [count, A, B]: a dozen small matrices in one bmm fill the SMs where a
// single small GEMM leaves most idle (cuBLAS may round a batched product differently from a
// single one). On the CPU each parameter takes its own chain, PyTorch's exact op sequence:
// batching gains nothing there and ATen's CPU bmm can round differently from mm, so fogo::Muon
// stays bit-identical to torch.optim.Muon (tested on single- and multi-parameter groups).
// docs/muon.md has the details.

#include <fogo/matrix_optimizer.h>
#include <fogo/muon_options.h>
#include <fogo/newton_schulz.h>
#include <fogo/nonfinite.h>
#include <fogo/step_shard.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace fogo {

/// lr scaled for a matrix of A rows and B columns: (lr f1) f2 with (f1, f2) the factors below,
/// so that a learning rate read on the device (muon_update) rounds as this one does.
/// `lr_dtype`: the precision of that arithmetic, double, or a Tensor lr's dtype (below).
double muon_adjusted_lr(double lr, MuonAdjustLR rule, int64_t A, int64_t B,
                        at::ScalarType lr_dtype = at::kDouble, double extra_scale_factor = 1.0);

/// The decay factor 1 - lr weight_decay, in double or in `lr_dtype`. torch.optim.Muon given a
/// Tensor lr computes both scalars with 0-d tensor ops in the tensor's dtype (a float32 lr rounds
/// them to float32, a bf16 one to bf16); with `lr_dtype` that dtype, these are its bits.
double muon_decay(double lr, double weight_decay, at::ScalarType lr_dtype = at::kDouble);

/// (f1, f2) of muon_adjusted_lr: f1 the rule's, Original sqrt(max(1, A / B)), MatchRmsAdamW 0.2
/// sqrt(max(A, B)), Spectral sqrt(A / B); f2 the option extra_scale_factor (1 by default: times 1,
/// exact). lr f1 f2 is torch.optim.Muon's `lr * adjusted_ratio * extra_scale_factor` (its pending
/// change) and Megatron-LM's. f1 is a function of the shape alone: a block of a fused weight takes
/// its own (rows, cols).
std::pair<double, double> muon_adjusted_lr_factors(MuonAdjustLR rule, int64_t A, int64_t B,
                                                   double extra_scale_factor = 1.0);

/// One matrix of a row-sharded step (muon_step_rows): this rank's rows of a parameter, of its
/// gradient and of its momentum buffer (a contiguous range of the whole matrix's rows, as FSDP2's
/// Shard(0) lays them out; possibly none), and the whole matrix's number of rows. With NorMuon
/// (MuonOptions::normuon) `second_moment` holds the same rows of the matrix's second moment
/// ([rows] in all, normuon_dtype: MuonParamState::second_moment laid out as the momentum);
/// without, it is not read. `first_row`: where this rank's rows start in the whole matrix (which
/// blocks of a heads/blocks layout they belong to, and so which adjusted learning rate each
/// takes).
struct MuonRows {
  at::Tensor param, grad, buf;
  int64_t rows = 0;
  at::Tensor second_moment = {};
  int64_t first_row = 0;
};

/// Where the rows of row-sharded matrices live (the caller's communication; both collectives,
/// called by every rank for every matrix k in order):
///   gather(k, update)     this rank's rows of matrix k's update in; out, the whole update
///                         [rows, ...] on the rank that orthogonalizes it, undefined elsewhere
///   scatter(k, O, out)    that rank's orthogonalized update O [rows, cols] (undefined elsewhere)
///                         in; this rank's rows of it written into `out`
/// With NorMuon each matrix's second moment [rows] travels the same way, between its update's
/// gather and its O's scatter: gathered to the same rank (which normalizes O with it) and
/// scattered back from it after O.
struct RowExchange {
  std::function<at::Tensor(size_t k, const at::Tensor& update)> gather;
  std::function<void(size_t k, const at::Tensor& O, const at::Tensor& out)> scatter;
};

/// fogo::Muon's step of one param group's matrices whose rows are spread over ranks
/// (owner-computes; fogo.Muon's FSDP2 path): the step's own code, with `exchange` supplying only
/// where the matrices live. The momentum and the Nesterov blend on this rank's rows, Newton–Schulz
/// of the whole update on the rank `gather` hands it to (a fused weight's heads or blocks, options
/// `heads` / `blocks`, each on its own as fogo::Muon does them), weight decay and the update on
/// this rank's rows with the adjusted learning rate of the matrix (or block) each row belongs to.
/// Every operation outside Newton–Schulz is elementwise and Newton–Schulz sees the whole matrix,
/// so the result is fogo::Muon's on the whole matrices bit for bit wherever that step runs one
/// Newton–Schulz per matrix (the CPU; on CUDA, matrices of distinct shapes). NorMuon
/// (`o.normuon()`) normalizes O on the rank holding it, with the whole second moment gathered
/// there (normuon.h), as fogo::Muon does. `batch_dims` is refused (a stack sharded along its
/// experts steps where it lies: fogo.Muon). `o`: the group's options (validated here);
/// `lr_dtype`: as set_lr_dtype (GroupFrame); `ok` (Mask): where false, the parameters, buffers and
/// second moments keep their bits. Every check runs before the first collective, alike on every
/// rank.
void muon_step_rows(const std::vector<MuonRows>& items, const MuonOptions& o,
                    at::ScalarType lr_dtype, const at::Tensor& ok, const RowExchange& exchange);

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);
  /// MuonOptions::normuon: the per-row second moment of the orthogonalized update, [size(0)],
  /// fp32 (fp64 for an fp64 parameter). Undefined until a step with normuon on (zeros then); a
  /// step with it off leaves it as it is.
  TORCH_ARG(torch::Tensor, second_moment);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Buffers equal (torch::equal; both undefined or both equal), as LibTorch's param states
  /// compare.
  friend bool operator==(const MuonParamState& a, const MuonParamState& b);
};

/// The step (step(), step_with()) and each group's step are the frame's (matrix_optimizer.h);
/// Muon's own part is its state and one param group's device work.
class Muon : public MatrixOptimizerOf<MuonOptions> {
 public:
  explicit Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<torch::Tensor> params, MuonOptions defaults = {})
      : Muon({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}
  ~Muon() override;
  Muon(Muon&&) noexcept;
  Muon& operator=(Muon&&) noexcept;

  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores state (moved to each parameter's device) and options; a checkpoint for other
  /// shapes or another group layout is rejected with an error and leaves this optimizer as it
  /// was.
  void load(torch::serialize::InputArchive& archive) override;

  /// The matrices of `param` under group `group`'s batch_dims, heads and blocks (matrix_view.h).
  MatrixView matrix_view(size_t group, const at::Tensor& param) const override;

 private:
  const char* name() const override { return "Muon"; }
  void check_param(size_t g, size_t i, const at::Tensor& p) const override;
  void create_state(const GroupStep& s) override;
  std::vector<at::Tensor> touched(const GroupStep& s) const override;
  /// Its momentum buffers (and NorMuon's second moments).
  std::vector<at::Tensor> masked_tensors(const StepInputs& in) const override;
  /// One group's device work: the momenta, Newton–Schulz and the update (sharded: Newton–Schulz
  /// and the update of the matrices this rank owns). Where in.ok is false the parameters keep
  /// their bits.
  void device_step(const StepInputs& in) override;
  /// Sharded (set_step_shard): every rank updates every momentum buffer (so checkpoints do not
  /// depend on the sharding), but runs Newton–Schulz and the update only for the matrices it
  /// owns (each matrix of a parameter's matrix view: every expert of a stack, every block of a
  /// fused weight); the frame's finish_step then exchanges every matrix with its rows of NorMuon's
  /// second moment (these).
  std::vector<at::Tensor> shard_values(size_t g, const at::Tensor& param, const MatrixView& view,
                                       int64_t k) const override;
  /// The momentum buffers of `params` (their state exists), or their NorMuon second moments
  /// (undefined where there is none).
  std::vector<at::Tensor> buffers(const std::vector<at::Tensor>& params,
                                  bool second_moments = false) const;
  void check_param_shape(size_t group, size_t index, const torch::Tensor& p,
                         const MuonOptions& options) const;
  template <typename Self, typename Archive>
  static void serialize(Self& self, Archive& archive) {
    _TORCH_OPTIM_SERIALIZE_WITH_TEMPLATE_ARG(Muon);
  }
};

}  // namespace fogo

#pragma once
// The hybrid: matrix parameters to FOGO or Muon, everything else to AdamW, stepped as one.
//
// split_parameters() (routing.h) decides which side each named parameter of a module goes to;
// HybridOptimizer is one torch::optim::Optimizer over both sides.

#include <c10/util/Type.h>
#include <fogo/adamw.h>
#include <fogo/nonfinite.h>
#include <fogo/param_groups.h>
#include <fogo/routing.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace fogo {

namespace detail {
struct GradItems;
}

/// Key that decides which codebook group (param group) a matrix parameter joins; the key is also
/// the group's name.
using GroupKey = std::function<std::string(const std::string& name, const torch::Tensor& param)>;

/// Groups by shape "rows x cols" of the 2-D view (the paper's GPT-2 setting: codebooks shared by
/// parameter shape / module type).
std::string shape_key(const std::string& name, const torch::Tensor& param);

/// Param groups and their names (keys), in the same order.
struct NamedGroups {
  std::vector<std::string> names;
  std::vector<torch::optim::OptimizerParamGroup> groups;
};

/// One param group per distinct key, in order of first appearance, named by the key; options
/// left to the optimizer's defaults.
NamedGroups group_by(const NamedParams& params, const GroupKey& key);

/// The hybrid as one torch::optim::Optimizer: matrix parameters stepped by FOGO or Muon, the rest
/// (biases, norms, embeddings, heads) by AdamW. Its param_groups() are all of them, matrix groups
/// first, each with its own options (FOGOOptions / MuonOptions / AdamWOptions) and a name, so
/// LibTorch's LR schedulers, torch::save / torch::load and any code written for
/// torch::optim::Optimizer& work on it unchanged.
///
/// The two sides are optimizers of their own, reached through matrix<T>() and rest<T>() for what
/// only they offer (FOGO's task_boundary() and telemetry(), say). Options belong to the hybrid's
/// param_groups(): set them there (or through a scheduler); each side reads them at every step
/// and whenever it is reached through the accessors. add_param_group() routes a group by its
/// options' type: AdamWOptions to the rest side, the matrix side's options type to it.
///
/// Migration from the two-optimizer HybridOptimizer of fogo 0.1: `static_cast<fogo::FOGO&>(
/// *opt.matrix())` becomes `opt.matrix<fogo::FOGO>()` (checked); options changed through the
/// sides' own param_groups() are overwritten by the hybrid's at the next step (change them in
/// opt.param_groups()); group_by() returns names with the groups; opt.state() is empty (each
/// side keeps its state).
class HybridOptimizer : public torch::optim::Optimizer, public ExactParamGroups {
 public:
  /// Either side may be null (a model without matrices, say), not both. `matrix_group_names`
  /// name the matrix side's param groups (default "matrix", or "matrix.<k>" for several); the
  /// rest side's are "rest" (or "rest.<k>").
  HybridOptimizer(std::unique_ptr<torch::optim::Optimizer> matrix,
                  std::unique_ptr<torch::optim::Optimizer> rest,
                  std::vector<std::string> matrix_group_names = {});
  HybridOptimizer(HybridOptimizer&&) noexcept = default;
  HybridOptimizer& operator=(HybridOptimizer&&) noexcept = default;

  /// Evaluates `closure` once (if given, with autograd on), then steps both sides. Unusable
  /// gradients (NaN/Inf, or a norm where the arithmetic overflows) are decided for the whole step
  /// by one decide_nonfinite (nonfinite.h) over both sides' gradients: a matrix group's by its
  /// own NonFinitePolicy, the AdamW side's by the matrix optimizer's default policy (its
  /// constructor's options: make_hybrid's `matrix_options`); without a fogo matrix side nothing is
  /// checked. Raise throws naming the parameter and its side, Skip returns, both having changed
  /// neither side; Mask steps both and keeps every tensor of both on the device, with nothing
  /// read back (the matrix side's groups by the step's flag; the AdamW side's parameters and
  /// moments put back; its step counters advance, as FOGO's do). Mask is checked on the host, as
  /// Skip, while an AdamW parameter has no state yet (its first step) or a FOGO group takes its
  /// first step.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Adds `group`, routed by its options' type (AdamWOptions to the rest side, the matrix side's
  /// options type to it; none: the matrix side's defaults), with exactly its own options on every
  /// LibTorch. It hides torch::optim::Optimizer::add_param_group, which since torch 2.15 replaces
  /// them by the defaults: a group added through a torch::optim::Optimizer& there is refused at
  /// the next step (param_groups.h).
  void add_param_group(const torch::optim::OptimizerParamGroup& group);
  void add_param_group_exactly(const torch::optim::OptimizerParamGroup& group) override {
    add_param_group(group);
  }

  /// Sets every group's lr to (its base lr) * factor: how a schedule drives both sides, whose
  /// base learning rates usually differ (Muon 2e-2 vs AdamW 3e-4, say).
  void set_lr_factor(double factor);
  double lr_factor() const { return factor_; }
  /// The base learning rates, one per param group: captured at construction, and for a group
  /// added later its lr when first seen here.
  const std::vector<double>& base_lrs() const;

  /// The name of param group `g` (group_by's key for matrix groups).
  const std::string& group_name(size_t g) const;

  /// Every trainable parameter of `module` as this optimizer holds it (the routing table of
  /// routing.h): route_parameters(module, rules) with each one's param group and update scale
  /// (update_scale of its group's options). A parameter held on the other side than `rules` send
  /// it to says so in its rule ("placed by hand"); one this optimizer does not hold has no group.
  std::vector<ParamRoute> routes(const torch::nn::Module& module,
                                 const ParamSplitRules& rules = {}) const;

  /// The matrix side as a T (FOGO, Muon, or torch::optim::Optimizer), with the hybrid's options;
  /// null when there is none. Throws when it is not a T.
  template <class T = torch::optim::Optimizer>
  T* matrix() {
    return side_as<T>(matrix_.get(), "matrix");
  }
  template <class T = torch::optim::Optimizer>
  const T* matrix() const {
    return side_as<T>(matrix_.get(), "matrix");
  }
  /// The rest side (fogo::FusedAdamW, a torch::optim::AdamW, as make_hybrid builds it); null when
  /// there is none.
  template <class T = torch::optim::Optimizer>
  T* rest() {
    return side_as<T>(rest_.get(), "rest");
  }
  template <class T = torch::optim::Optimizer>
  const T* rest() const {
    return side_as<T>(rest_.get(), "rest");
  }

  void save(torch::serialize::OutputArchive& archive) const override;
  /// Checks the checkpoint has the same sides and group layout before loading either side; a
  /// rejected checkpoint leaves this optimizer as it was.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  enum class Side { Matrix, Rest };
  template <class T>
  T* side_as(torch::optim::Optimizer* side, const char* which) const {
    if (!side) return nullptr;
    sync_options();
    T* typed = dynamic_cast<T*>(side);
    TORCH_CHECK(typed, "HybridOptimizer: the ", which, " side is not a ",
                c10::demangle(typeid(T).name()), " (it is a ", c10::demangle(typeid(*side).name()),
                ")");
    return typed;
  }
  std::vector<torch::optim::Optimizer*> sides() const;
  torch::optim::Optimizer* side(Side s) const {
    return s == Side::Matrix ? matrix_.get() : rest_.get();
  }
  /// Routes groups added to the hybrid since the last call to their side, then makes every
  /// side's group hold its hybrid group's options: lr set in place, the options copied only when
  /// another option differs (an unchanged step copies nothing).
  void sync_options() const;
  /// The sides' options (after a load) into the hybrid's groups.
  void pull_options();
  /// decide_nonfinite over the step's gradients `items` (the hybrid's groups), each by its
  /// side's policy; `rest_maskable()`: whether the AdamW side can be put back now.
  NonFiniteDecision decide(const detail::GradItems& items,
                           const std::function<bool()>& rest_maskable) const;
  /// Hybrid group `g`'s decoupled weight decay, for the validation of the step's scalars.
  double weight_decay(size_t g) const;

  std::unique_ptr<torch::optim::Optimizer> matrix_, rest_;
  /// For each of the hybrid's param groups: its side and index there.
  mutable std::vector<std::pair<Side, size_t>> route_;
  /// How many param groups came in through the constructor or add_param_group above.
  size_t exact_groups_ = 0;
  mutable std::vector<std::string> names_;
  mutable std::vector<double> base_lrs_;
  double factor_ = 1.0;
};

/// Builds the usual hybrid for `module`: Matrix (fogo::Muon, fogo::FOGO) with
/// `matrix_options` on the split's matrix side (one param group per `group_key`, named by it, or
/// a single group "matrix" when it is empty), AdamW with `adamw_options` on the rest ("rest"):
/// fogo::FusedAdamW, torch::optim::AdamW stepped by PyTorch's fused kernel (adamw.h).
template <class Matrix, class MatrixOptions>
HybridOptimizer make_hybrid(const torch::nn::Module& module, const MatrixOptions& matrix_options,
                            const torch::optim::AdamWOptions& adamw_options,
                            const ParamSplitRules& rules = {}, const GroupKey& group_key = {}) {
  ParamSplit split = split_parameters(module, rules);
  std::unique_ptr<torch::optim::Optimizer> matrix, rest;
  std::vector<std::string> names;
  if (split.matrix.size() > 0) {
    if (group_key) {
      NamedGroups groups = group_by(split.matrix, group_key);
      matrix = std::make_unique<Matrix>(groups.groups, matrix_options);
      names = std::move(groups.names);
    } else {
      matrix = std::make_unique<Matrix>(split.matrix.params, matrix_options);
    }
  }
  if (split.rest.size() > 0) {
    rest = std::make_unique<FusedAdamW>(split.rest.params, adamw_options);
  }
  return HybridOptimizer(std::move(matrix), std::move(rest), std::move(names));
}

}  // namespace fogo

#pragma once
// The hybrid: matrix parameters to FOGO or Muon, everything else to AdamW, stepped as one.
//
// split_parameters() decides which side each named parameter of a module goes to;
// HybridOptimizer is one torch::optim::Optimizer over both sides.

#include <c10/util/Type.h>
#include <fogo/nonfinite.h>
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

struct ParamSplitRules {
  /// ECMAScript regexes searched in the parameter's full name; a match sends a matrix-shaped
  /// parameter to the AdamW side. The default catches the usual output heads and classifiers.
  std::vector<std::string> rest_patterns{R"((^|\.)(lm_head|head|classifier|output)\.)"};
  /// Regexes that force a parameter to the matrix side (checked first; the parameter must be at
  /// least 2-D).
  std::vector<std::string> matrix_patterns{};
  /// Weights of torch::nn::Embedding / EmbeddingBag modules go to AdamW (a lookup table is not
  /// a linear map, so orthogonalizing its update has no meaning).
  bool embeddings_to_rest = true;
};

struct NamedParams {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  size_t size() const { return params.size(); }
};

struct ParamSplit {
  NamedParams matrix;  ///< >= 2-D weights for FOGO / Muon
  NamedParams rest;    ///< biases, norms, embeddings, heads for AdamW
};

/// Splits `module.named_parameters()` (those with requires_grad) by `rules` (matrix_side).
ParamSplit split_parameters(const torch::nn::Module& module, const ParamSplitRules& rules = {});

/// A parameter as the split sees it: its full name, its shape, and whether it is a weight of an
/// Embedding / EmbeddingBag module.
struct SplitInput {
  std::string name;
  std::vector<int64_t> sizes;
  bool embedding = false;
};

/// The split's rule, per parameter: true for the matrix side. A parameter matching one of
/// `rules.matrix_patterns` goes there (it must be >= 2-D); otherwise a >= 2-D one does unless it
/// is an embedding weight (with embeddings_to_rest) or matches rest_patterns. split_parameters
/// applies it to a module; Python's fogo.split_parameters to an nn.Module's parameters. Throws
/// c10::ValueError on an invalid regex, or when a matrix_patterns match names a 0-D/1-D
/// parameter.
std::vector<bool> matrix_side(const std::vector<SplitInput>& params, const ParamSplitRules& rules);

/// The split's rule with its reason, per parameter (matrix_side is its `matrix`): which rule sent
/// the parameter where ("matrix_patterns '<p>'", "1-D (biases, norms, scalars)", "embedding
/// weight (embeddings_to_rest)", "rest_patterns '<p>'", "2-D weight", ...).
struct SplitRoute {
  bool matrix = false;
  std::string rule;
};
std::vector<SplitRoute> split_routes(const std::vector<SplitInput>& params,
                                     const ParamSplitRules& rules);

/// One trainable parameter of a module as split_parameters routes it: its name, shape, side
/// (matrix optimizer or AdamW) and the rule that sent it there. route_parameters returns them in
/// named_parameters() order; routing_table prints them as a Markdown table, with how the matrix
/// side treats each (one [size(0), numel / size(0)] matrix: conv weights flattened).
struct ParamRoute {
  std::string name;
  std::vector<int64_t> sizes;
  bool matrix = false;
  std::string rule;
};
std::vector<ParamRoute> route_parameters(const torch::nn::Module& module,
                                         const ParamSplitRules& rules = {});
std::string routing_table(const std::vector<ParamRoute>& routes);

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
class HybridOptimizer : public torch::optim::Optimizer {
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

  /// Sets every group's lr to (its base lr) * factor: how a schedule drives both sides, whose
  /// base learning rates usually differ (Muon 2e-2 vs AdamW 3e-4, say).
  void set_lr_factor(double factor);
  double lr_factor() const { return factor_; }
  /// The base learning rates, one per param group: captured at construction, and for a group
  /// added later its lr when first seen here.
  const std::vector<double>& base_lrs() const;

  /// The name of param group `g` (group_by's key for matrix groups).
  const std::string& group_name(size_t g) const;

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
  /// The rest side (torch::optim::AdamW as make_hybrid builds it); null when there is none.
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
  /// Routes groups added to the hybrid since the last call to their side, then copies every
  /// group's options to the side's group.
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
  mutable std::vector<std::string> names_;
  mutable std::vector<double> base_lrs_;
  double factor_ = 1.0;
};

/// Builds the usual hybrid for `module`: Matrix (fogo::Muon, fogo::FOGO) with
/// `matrix_options` on the split's matrix side (one param group per `group_key`, named by it, or
/// a single group "matrix" when it is empty), AdamW with `adamw_options` on the rest ("rest").
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
    rest = std::make_unique<torch::optim::AdamW>(split.rest.params, adamw_options);
  }
  return HybridOptimizer(std::move(matrix), std::move(rest), std::move(names));
}

}  // namespace fogo

#pragma once
// The hybrid: matrix parameters to FOGO or Muon, everything else to AdamW, stepped as one.
//
// split_parameters() decides which side each named parameter of a module goes to;
// HybridOptimizer owns the two optimizers and steps, zero-grads, saves/loads and scales the
// learning rate of both together.

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fogo {

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

/// Splits `module.named_parameters()` (those with requires_grad) by `rules`. Throws on an
/// invalid regex, or when a matrix_patterns match names a 0-D/1-D parameter.
ParamSplit split_parameters(const torch::nn::Module& module, const ParamSplitRules& rules = {});

/// Key that decides which codebook group (param group) a matrix parameter joins.
using GroupKey = std::function<std::string(const std::string& name, const torch::Tensor& param)>;

/// Groups by shape "rows x cols" of the 2-D view (the paper's GPT-2 setting: codebooks shared by
/// parameter shape / module type).
std::string shape_key(const std::string& name, const torch::Tensor& param);

/// One param group per distinct key, in order of first appearance; options left to the
/// optimizer's defaults.
std::vector<torch::optim::OptimizerParamGroup> group_by(const NamedParams& params,
                                                        const GroupKey& key);

class HybridOptimizer {
 public:
  /// Either side may be null (a model without matrices, say), not both.
  HybridOptimizer(std::unique_ptr<torch::optim::Optimizer> matrix,
                  std::unique_ptr<torch::optim::Optimizer> rest);

  /// Evaluates `closure` once (if given, with autograd on), then steps both optimizers. NaN/Inf
  /// gradients on either side are handled for the whole step by the matrix side's policy
  /// (FOGO's NonFinitePolicy, Muon's check_finite): Skip steps neither side, Raise throws naming
  /// the parameter and steps neither side.
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr);
  void zero_grad(bool set_to_none = true);

  /// Sets every group's lr to (its base lr) * factor: how a schedule drives both sides, whose
  /// base learning rates usually differ (Muon 2e-2 vs AdamW 3e-4, say).
  void set_lr_factor(double factor);
  double lr_factor() const { return factor_; }
  /// The base learning rates, matrix groups first, then rest groups: captured at construction,
  /// and for a group added later (add_param_group on a side) its lr when first seen here.
  const std::vector<double>& base_lrs() const;

  torch::optim::Optimizer* matrix() { return matrix_.get(); }
  torch::optim::Optimizer* rest() { return rest_.get(); }

  void save(torch::serialize::OutputArchive& archive) const;
  /// Checks the checkpoint has the same sides and group layout before loading either side.
  void load(torch::serialize::InputArchive& archive);

 private:
  std::vector<torch::optim::Optimizer*> sides() const;
  void capture_base_lrs() const;
  std::unique_ptr<torch::optim::Optimizer> matrix_, rest_;
  mutable std::vector<double> base_lrs_;
  mutable size_t matrix_groups_ = 0;  ///< matrix-side groups whose base lr is in base_lrs_
  double factor_ = 1.0;
};

/// Builds the usual hybrid for `module`: MatrixOptimizer (fogo::Muon, fogo::FOGO) with
/// `matrix_options` on the split's matrix side (one param group per `group_key`, or a single
/// group when it is empty), AdamW with `adamw_options` on the rest.
template <class MatrixOptimizer, class MatrixOptions>
HybridOptimizer make_hybrid(const torch::nn::Module& module, const MatrixOptions& matrix_options,
                            const torch::optim::AdamWOptions& adamw_options,
                            const ParamSplitRules& rules = {}, const GroupKey& group_key = {}) {
  ParamSplit split = split_parameters(module, rules);
  std::unique_ptr<torch::optim::Optimizer> matrix, rest;
  if (split.matrix.size() > 0) {
    matrix = group_key ? std::make_unique<MatrixOptimizer>(group_by(split.matrix, group_key),
                                                           matrix_options)
                       : std::make_unique<MatrixOptimizer>(split.matrix.params, matrix_options);
  }
  if (split.rest.size() > 0) {
    rest = std::make_unique<torch::optim::AdamW>(split.rest.params, adamw_options);
  }
  return HybridOptimizer(std::move(matrix), std::move(rest));
}

/// torch::save(hybrid, path) / torch::load(hybrid, path).
inline torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                                   const HybridOptimizer& opt) {
  opt.save(archive);
  return archive;
}
inline torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                                  HybridOptimizer& opt) {
  opt.load(archive);
  return archive;
}

}  // namespace fogo

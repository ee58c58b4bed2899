#pragma once
// The split of a model's parameters between a matrix optimizer (FOGO, Muon) and AdamW, as rules,
// as data (route_parameters: side, rule, group, update scale per parameter) and as a table.

#include <fogo/matrix_options.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <string>
#include <utility>
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

/// The update scale (matrix_options.h) `options` give a parameter of shape `sizes`: a matrix
/// optimizer's (MatrixOptions::update_scale: MuonOptions, FOGOOptions), AdamWOptions', or for
/// other options their lr alone.
UpdateScale update_scale(const torch::optim::OptimizerOptions& options,
                         const std::vector<int64_t>& sizes);

/// How `options` treat a parameter of shape `sizes` (the routing table's "treated as"): "one 16x48
/// matrix (its trailing dimensions flattened)", "8 x [64, 256] matrices" (a stack),
/// "[8, 5] + 2 x [4, 5] matrices" (blocks).
std::string treated_as(const torch::optim::OptimizerOptions& options,
                       const std::vector<int64_t>& sizes);

/// One trainable parameter of a module as split_parameters routes it: its name, shape, side
/// (matrix optimizer or AdamW) and the rule that sent it there; from an optimizer that holds it
/// (HybridOptimizer::routes), also its param group's name and its update scale. route_parameters
/// returns them in named_parameters() order; routing_table prints them as a Markdown table, with
/// how the matrix side treats each (one [size(0), numel / size(0)] matrix: conv weights
/// flattened).
struct ParamRoute {
  std::string name;
  std::vector<int64_t> sizes;
  bool matrix = false;
  std::string rule;
  std::string group;    ///< empty: not from an optimizer
  UpdateScale scale;    ///< text empty: not from an optimizer
  std::string treated;  ///< treated_as under its group's options; empty: one matrix by default
};
std::vector<ParamRoute> route_parameters(const torch::nn::Module& module,
                                         const ParamSplitRules& rules = {});
/// The routes as a Markdown table: parameter, shape, side, rule, treated as, and, when any route
/// comes from an optimizer, group and update scale.
std::string routing_table(const std::vector<ParamRoute>& routes);

}  // namespace fogo

// The split of a model's parameters between the matrix optimizer and AdamW (routing.h): the rule
// (split_routes), applied to a module (split_parameters, route_parameters), and printed.
#include "fogo/routing.h"

#include <torch/nn/modules/embedding.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <regex>
#include <sstream>
#include <unordered_set>

#include "fogo/matrix_options.h"
#include "fogo/matrix_view.h"
#include "fogo_private/frame/scale_text.h"

namespace fogo {
namespace {

std::vector<std::regex> compile(const std::vector<std::string>& patterns, const char* field) {
  std::vector<std::regex> out;
  for (const auto& pattern : patterns) {
    try {
      out.emplace_back(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      TORCH_CHECK_VALUE(false, "ParamSplitRules.", field, ": invalid regex '", pattern,
                        "': ", e.what());
    }
  }
  return out;
}

// The index of the first of `patterns` found in `name`, or -1.
int64_t first_match(const std::vector<std::regex>& patterns, const std::string& name) {
  for (size_t k = 0; k < patterns.size(); ++k) {
    if (std::regex_search(name, patterns[k])) return static_cast<int64_t>(k);
  }
  return -1;
}

}  // namespace

std::vector<SplitRoute> split_routes(const std::vector<SplitInput>& params,
                                     const ParamSplitRules& rules) {
  const auto rest_patterns = compile(rules.rest_patterns, "rest_patterns");
  const auto matrix_patterns = compile(rules.matrix_patterns, "matrix_patterns");
  std::vector<SplitRoute> out;
  for (const SplitInput& p : params) {
    const auto dim = p.sizes.size();
    const int64_t forced = first_match(matrix_patterns, p.name);
    const int64_t rest = forced < 0 ? first_match(rest_patterns, p.name) : -1;
    if (forced >= 0) {
      TORCH_CHECK_VALUE(dim >= 2, "ParamSplitRules.matrix_patterns matched '", p.name,
                        "' of shape ", at::IntArrayRef(p.sizes),
                        ", but matrix optimizers need >= 2-D parameters");
      out.push_back({true, "matrix_patterns '" + rules.matrix_patterns[forced] + "'"});
    } else if (dim < 2) {
      out.push_back({false, std::to_string(dim) + "-D (biases, norms, scalars)"});
    } else if (rules.embeddings_to_rest && p.embedding) {
      out.push_back({false, "embedding weight (embeddings_to_rest)"});
    } else if (rest >= 0) {
      out.push_back({false, "rest_patterns '" + rules.rest_patterns[rest] + "'"});
    } else {
      out.push_back({true, std::to_string(dim) + "-D weight"});
    }
  }
  return out;
}

std::vector<bool> matrix_side(const std::vector<SplitInput>& params, const ParamSplitRules& rules) {
  std::vector<bool> out;
  for (const SplitRoute& route : split_routes(params, rules)) out.push_back(route.matrix);
  return out;
}

namespace {

// `module`'s trainable parameters as the split sees them, with the tensors, in its order.
std::pair<std::vector<SplitInput>, std::vector<at::Tensor>> described(
    const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> embedding_weights;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (child->as<torch::nn::Embedding>() || child->as<torch::nn::EmbeddingBag>()) {
      for (const auto& p : child->parameters()) embedding_weights.insert(p.unsafeGetTensorImpl());
    }
  }
  std::pair<std::vector<SplitInput>, std::vector<at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    const at::Tensor& p = item.value();
    out.first.push_back(
        {item.key(), p.sizes().vec(), embedding_weights.count(p.unsafeGetTensorImpl()) > 0});
    out.second.push_back(p);
  }
  return out;
}

}  // namespace

ParamSplit split_parameters(const torch::nn::Module& module, const ParamSplitRules& rules) {
  const auto [inputs, tensors] = described(module);
  const std::vector<bool> to_matrix = matrix_side(inputs, rules);
  ParamSplit split;
  for (size_t k = 0; k < inputs.size(); ++k) {
    NamedParams& side = to_matrix[k] ? split.matrix : split.rest;
    side.names.push_back(inputs[k].name);
    side.params.push_back(tensors[k]);
  }
  return split;
}

std::vector<ParamRoute> route_parameters(const torch::nn::Module& module,
                                         const ParamSplitRules& rules) {
  const auto inputs = described(module).first;
  const std::vector<SplitRoute> routes = split_routes(inputs, rules);
  std::vector<ParamRoute> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    out.push_back({inputs[k].name, inputs[k].sizes, routes[k].matrix, routes[k].rule});
  }
  return out;
}

namespace {

// A table cell: '|' (a regex's alternation) escaped so that it does not end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

// `options` as a matrix optimizer's (MuonOptions, FOGOOptions, ...), or null: the one cross-cast
// routing makes to read layouts and update scales.
const MatrixOptions* matrix_options(const torch::optim::OptimizerOptions& options) {
  return dynamic_cast<const MatrixOptions*>(&options);
}

// The layout `options` cut parameters into matrices by (the default for options without one).
MatrixLayout layout_of(const torch::optim::OptimizerOptions& options) {
  const MatrixOptions* matrix = matrix_options(options);
  return matrix ? matrix->layout() : MatrixLayout{};
}

MatrixView view_of(const std::vector<int64_t>& sizes, const MatrixLayout& layout) {
  return matrix_view(at::IntArrayRef(sizes), layout, "routing", "a parameter");
}

std::string treatment(const std::vector<int64_t>& sizes, const MatrixView& view) {
  if (view.single()) {
    return "one " + std::to_string(view.rows) + "x" + std::to_string(view.cols) + " matrix" +
           (sizes.size() > 2 ? " (its trailing dimensions flattened)" : "");
  }
  return to_string(view) + " matrices";
}

}  // namespace

UpdateScale update_scale(const torch::optim::OptimizerOptions& options,
                         const std::vector<int64_t>& sizes) {
  if (const MatrixOptions* matrix = matrix_options(options)) return matrix->update_scale(sizes);
  UpdateScale s;
  s.lr = options.get_lr();
  // LibTorch's AdamW is not fogo's to extend: its words are here.
  s.text = dynamic_cast<const torch::optim::AdamWOptions*>(&options)
               ? "AdamW, lr " + detail::scale_number(s.lr) + " (per entry at most ~lr)"
               : "lr " + detail::scale_number(s.lr) + " (its optimizer's own scale)";
  return s;
}

std::string treated_as(const torch::optim::OptimizerOptions& options,
                       const std::vector<int64_t>& sizes) {
  return treatment(sizes, view_of(sizes, layout_of(options)));
}

std::string routing_table(const std::vector<ParamRoute>& routes) {
  const bool held = std::any_of(routes.begin(), routes.end(),
                                [](const ParamRoute& r) { return !r.scale.text.empty(); });
  std::ostringstream out;
  out << "| parameter | shape | side | rule | treated as |"
      << (held ? " group | update scale |\n|---|---|---|---|---|---|---|\n"
               : "\n|---|---|---|---|---|\n");
  for (const ParamRoute& r : routes) {
    out << "| " << cell(r.name) << " | " << at::IntArrayRef(r.sizes) << " | "
        << (r.matrix ? "matrix" : "AdamW") << " | " << cell(r.rule) << " | ";
    if (!r.matrix) {
      out << "as is";
    } else {
      out << (r.treated.empty() ? treatment(r.sizes, view_of(r.sizes, {})) : r.treated);
    }
    out << " |";
    if (held)
      out << " " << (r.group.empty() ? "-" : r.group) << " | "
          << (r.scale.text.empty() ? "not in this optimizer" : r.scale.text) << " |";
    out << "\n";
  }
  return out.str();
}

}  // namespace fogo

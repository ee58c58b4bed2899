#include "fogo/hybrid.h"

#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include "fogo/detail/checks.h"
#include "fogo/fogo_optimizer.h"
#include "fogo/muon.h"

namespace fogo {
namespace {

std::vector<std::regex> compile(const std::vector<std::string>& patterns, const char* field) {
  std::vector<std::regex> out;
  for (const auto& pattern : patterns) {
    try {
      out.emplace_back(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      TORCH_CHECK(false, "ParamSplitRules.", field, ": invalid regex '", pattern, "': ", e.what());
    }
  }
  return out;
}

bool any_match(const std::vector<std::regex>& patterns, const std::string& name) {
  for (const auto& re : patterns) {
    if (std::regex_search(name, re)) return true;
  }
  return false;
}

std::string to_bytes(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void from_bytes(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.state().clear();  // loading only adds entries; the snapshot holds the complete state
  opt.load(archive);
}

// LibTorch's own optimizers (AdamW) load whatever a checkpoint holds; a state tensor of the
// wrong shape would only fail, obscurely, at the next step. Catch it at load time.
void check_state_shapes(const torch::optim::Optimizer& opt, const char* side) {
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto& p = groups[g].params()[i];
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      if (!adamw) continue;
      for (const auto& t : {adamw->exp_avg(), adamw->exp_avg_sq()}) {
        TORCH_CHECK(!t.defined() || t.sizes() == p.sizes(), "HybridOptimizer::load: the ", side,
                    " optimizer's checkpoint state for parameter ", i, " of group ", g,
                    " has shape ", t.sizes(), " but the parameter has shape ", p.sizes(),
                    "; the checkpoint was made for a different model");
      }
    }
  }
}

enum class NonFiniteCheck { None, Raise, Skip };

// What the matrix side does with NaN/Inf gradients: FOGO raises or skips by its groups'
// NonFinitePolicy (Skip in any group skips), Muon raises where check_finite is on; a hybrid
// without a matrix side behaves as LibTorch's AdamW (no check).
NonFiniteCheck nonfinite_check(const torch::optim::Optimizer* matrix) {
  NonFiniteCheck check = NonFiniteCheck::None;
  if (!matrix) return check;
  for (const auto& group : matrix->param_groups()) {
    if (const auto* f = dynamic_cast<const FOGOOptions*>(&group.options())) {
      if (f->nonfinite() == NonFinitePolicy::Skip) return NonFiniteCheck::Skip;
      check = NonFiniteCheck::Raise;
    } else if (const auto* m = dynamic_cast<const MuonOptions*>(&group.options())) {
      if (m->check_finite()) check = NonFiniteCheck::Raise;
    }
  }
  return check;
}

}  // namespace

ParamSplit split_parameters(const torch::nn::Module& module, const ParamSplitRules& rules) {
  const auto rest_patterns = compile(rules.rest_patterns, "rest_patterns");
  const auto matrix_patterns = compile(rules.matrix_patterns, "matrix_patterns");

  std::unordered_set<const c10::TensorImpl*> embedding_weights;
  if (rules.embeddings_to_rest) {
    for (const auto& child : module.modules(/*include_self=*/true)) {
      if (child->as<torch::nn::Embedding>() || child->as<torch::nn::EmbeddingBag>()) {
        for (const auto& p : child->parameters()) embedding_weights.insert(p.unsafeGetTensorImpl());
      }
    }
  }

  ParamSplit split;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    bool to_matrix;
    if (any_match(matrix_patterns, name)) {
      TORCH_CHECK(p.dim() >= 2, "ParamSplitRules.matrix_patterns matched '", name, "' of shape ",
                  p.sizes(), ", but matrix optimizers need >= 2-D parameters");
      to_matrix = true;
    } else {
      to_matrix = p.dim() >= 2 && !embedding_weights.count(p.unsafeGetTensorImpl()) &&
                  !any_match(rest_patterns, name);
    }
    NamedParams& side = to_matrix ? split.matrix : split.rest;
    side.names.push_back(name);
    side.params.push_back(p);
  }
  return split;
}

std::string shape_key(const std::string& /*name*/, const torch::Tensor& param) {
  const int64_t rows = param.dim() > 0 ? param.size(0) : 1;
  const int64_t cols = rows > 0 ? param.numel() / rows : 0;
  return std::to_string(rows) + "x" + std::to_string(cols);
}

std::vector<torch::optim::OptimizerParamGroup> group_by(const NamedParams& params,
                                                        const GroupKey& key) {
  std::vector<std::string> keys;
  std::vector<std::vector<torch::Tensor>> members;
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string group = key(params.names[k], params.params[k]);
    auto it = std::find(keys.begin(), keys.end(), group);
    if (it == keys.end()) {
      keys.push_back(group);
      members.emplace_back();
      it = keys.end() - 1;
    }
    members[it - keys.begin()].push_back(params.params[k]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& m : members) groups.emplace_back(std::move(m));
  return groups;
}

HybridOptimizer::HybridOptimizer(std::unique_ptr<torch::optim::Optimizer> matrix,
                                 std::unique_ptr<torch::optim::Optimizer> rest)
    : matrix_(std::move(matrix)), rest_(std::move(rest)) {
  TORCH_CHECK(matrix_ || rest_, "HybridOptimizer: both the matrix and the rest optimizer are null");
  capture_base_lrs();
}

const std::vector<double>& HybridOptimizer::base_lrs() const {
  capture_base_lrs();
  return base_lrs_;
}

void HybridOptimizer::capture_base_lrs() const {
  // Groups are only ever appended (add_param_group), matrix side first in base_lrs_: a group
  // added to the matrix side after construction is inserted before the rest side's rates.
  size_t k = 0;
  for (auto* side : sides()) {
    const auto& groups = side->param_groups();
    const size_t known = side == matrix_.get() ? matrix_groups_ : base_lrs_.size() - matrix_groups_;
    for (size_t g = known; g < groups.size(); ++g) {
      base_lrs_.insert(base_lrs_.begin() + static_cast<std::ptrdiff_t>(k + g),
                       groups[g].options().get_lr());
    }
    k += groups.size();
    if (side == matrix_.get()) matrix_groups_ = groups.size();
  }
}

std::vector<torch::optim::Optimizer*> HybridOptimizer::sides() const {
  std::vector<torch::optim::Optimizer*> out;
  if (matrix_) out.push_back(matrix_.get());
  if (rest_) out.push_back(rest_.get());
  return out;
}

torch::Tensor HybridOptimizer::step(torch::optim::Optimizer::LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    // Optimizers run their closure with autograd on (LibTorch's do), even inside a
    // NoGradGuard: the closure computes a loss and its gradients.
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  // The matrix side's NaN/Inf policy holds for the whole step: with Skip nothing is stepped,
  // with Raise the error names the parameter and nothing is stepped (AdamW, on the rest side,
  // would otherwise write NaN into the biases and norms).
  const NonFiniteCheck check = nonfinite_check(matrix_.get());
  if (check != NonFiniteCheck::None) {
    std::vector<at::Tensor> grads;
    std::vector<std::tuple<const char*, size_t, size_t, at::Tensor>> where;
    for (auto* side : sides()) {
      const auto& groups = side->param_groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (size_t i = 0; i < groups[g].params().size(); ++i) {
          const at::Tensor& p = groups[g].params()[i];
          if (!p.grad().defined()) continue;
          grads.push_back(p.grad());
          where.emplace_back(side == matrix_.get() ? "HybridOptimizer (matrix side)"
                                                   : "HybridOptimizer (rest side)",
                             g, i, p);
        }
      }
    }
    if (const int64_t bad = detail::first_nonfinite(grads); bad >= 0) {
      if (check == NonFiniteCheck::Skip) return loss;
      const auto& [name, g, i, p] = where[bad];
      detail::throw_nonfinite(name, g, i, p);
    }
  }
  for (auto* side : sides()) side->step();
  return loss;
}

void HybridOptimizer::zero_grad(bool set_to_none) {
  for (auto* side : sides()) side->zero_grad(set_to_none);
}

void HybridOptimizer::set_lr_factor(double factor) {
  TORCH_CHECK(std::isfinite(factor) && factor >= 0,
              "HybridOptimizer::set_lr_factor: factor must be finite and >= 0, got ", factor);
  capture_base_lrs();
  size_t k = 0;
  for (auto* side : sides()) {
    for (auto& group : side->param_groups()) group.options().set_lr(base_lrs_[k++] * factor);
  }
  factor_ = factor;
}

void HybridOptimizer::save(torch::serialize::OutputArchive& archive) const {
  capture_base_lrs();
  archive.write("fogo_hybrid/format", c10::IValue(static_cast<int64_t>(1)));
  archive.write("fogo_hybrid/lr_factor", c10::IValue(factor_));
  archive.write("fogo_hybrid/base_lrs", c10::IValue(c10::List<double>(base_lrs_)));
  const char* names[] = {"matrix", "rest"};
  torch::optim::Optimizer* opts[] = {matrix_.get(), rest_.get()};
  for (int s = 0; s < 2; ++s) {
    archive.write(std::string("fogo_hybrid/has_") + names[s], c10::IValue(opts[s] != nullptr));
    if (!opts[s]) continue;
    torch::serialize::OutputArchive side(archive.compilation_unit());
    opts[s]->save(side);
    archive.write(std::string("fogo_hybrid/") + names[s], side);
  }
}

void HybridOptimizer::load(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read("fogo_hybrid/format", value) && value.toInt() == 1,
              "HybridOptimizer::load: not a fogo hybrid checkpoint (format 1)");
  archive.read("fogo_hybrid/base_lrs", value);
  std::vector<double> base_lrs = value.toDoubleVector();
  capture_base_lrs();
  TORCH_CHECK(base_lrs.size() == base_lrs_.size(), "HybridOptimizer::load: the checkpoint has ",
              base_lrs.size(), " parameter groups in all, this optimizer ", base_lrs_.size());
  const char* names[] = {"matrix", "rest"};
  torch::optim::Optimizer* opts[] = {matrix_.get(), rest_.get()};
  std::vector<torch::serialize::InputArchive> inputs(2);
  for (int s = 0; s < 2; ++s) {
    archive.read(std::string("fogo_hybrid/has_") + names[s], value);
    TORCH_CHECK(value.toBool() == (opts[s] != nullptr), "HybridOptimizer::load: the checkpoint ",
                value.toBool() ? "has" : "lacks", " a ", names[s], " optimizer, this one ",
                opts[s] ? "has" : "lacks", " one");
    if (opts[s]) archive.read(std::string("fogo_hybrid/") + names[s], inputs[s]);
  }
  // Load both sides or neither: snapshot each first, and restore both if either side fails.
  std::vector<std::string> snapshots;
  for (auto* side : sides()) snapshots.push_back(to_bytes(*side));
  try {
    for (int s = 0; s < 2; ++s) {
      if (!opts[s]) continue;
      opts[s]->load(inputs[s]);
      check_state_shapes(*opts[s], names[s]);
    }
  } catch (...) {
    size_t k = 0;
    for (auto* side : sides()) from_bytes(*side, snapshots[k++]);
    throw;
  }
  archive.read("fogo_hybrid/lr_factor", value);
  base_lrs_ = std::move(base_lrs);
  factor_ = value.toDouble();
}

}  // namespace fogo

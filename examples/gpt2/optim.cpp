#include "optim.h"

#include <fogo/enum_names.h>
#include <fogo/fogo.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>

#include "common/cli.h"
#include "common/fogo_flags.h"
#include "common/optimizers.h"

namespace gpt2 {

void validate(const OptimizerConfig& c) {
  namespace tr = fogo::trainer;
  tr::Cli::require(c.name == "adamw" || c.name == "muon" || c.name == "fogo", "optimizer",
                   "expected one of adamw,muon,fogo, got '" + c.name + "'");
  tr::Cli::require(c.lr > 0.0, "lr", "must be > 0, got " + tr::flag_text(c.lr));
  tr::Cli::require(!c.matrix_lr || *c.matrix_lr > 0.0, "matrix-lr",
                   "must be > 0, got " + tr::flag_text(c.matrix_lr.value_or(0.0)));
  tr::Cli::require(c.weight_decay >= 0.0, "weight-decay",
                   "must be >= 0, got " + tr::flag_text(c.weight_decay));
  tr::Cli::require(c.beta1 >= 0.0 && c.beta1 < 1.0, "beta1",
                   "must be in [0, 1), got " + tr::flag_text(c.beta1));
  tr::Cli::require(c.beta2 >= 0.0 && c.beta2 < 1.0, "beta2",
                   "must be in [0, 1), got " + tr::flag_text(c.beta2));
  tr::Cli::require(c.muon_momentum >= 0.0 && c.muon_momentum < 1.0, "muon-momentum",
                   "must be in [0, 1), got " + tr::flag_text(c.muon_momentum));
  tr::parse_muon_adjust(c.muon_adjust);
  tr::parse_ns_dtype(c.ns_dtype);
  fogo_options(c);  // a bad --fogo or --ablation fails before the run, for every optimizer
  muon_options(c);  // ... and so does a bad --muon-ns-schedule or --muon-extra-scale
}

fogo::MuonOptions muon_options(const OptimizerConfig& c) {
  namespace tr = fogo::trainer;
  const auto adjust = tr::parse_muon_adjust(c.muon_adjust);
  fogo::NSSchedule schedule;
  try {
    schedule = tr::parse_ns_coefficient_schedule(c.muon_ns_schedule);
  } catch (const std::invalid_argument& e) {
    throw tr::Cli::error("muon-ns-schedule", e.what());
  }
  auto options = fogo::MuonOptions(c.matrix_lr.value_or(c.lr))
                     .weight_decay(c.weight_decay)
                     .momentum(c.muon_momentum)
                     .adjust_lr(adjust)
                     .ns_dtype(tr::parse_ns_dtype(c.ns_dtype))
                     .normuon(c.muon_normuon)
                     .ns_steps(c.muon_ns_steps)
                     .ns_coefficient_schedule(schedule)
                     .extra_scale_factor(c.muon_extra_scale);
  try {
    options.validate();
  } catch (const std::exception& e) {  // the option's message, under the flag that set it
    std::string what = e.what();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    const char* flag = what.find("extra_scale_factor") != std::string::npos ? "muon-extra-scale"
                       : what.find("ns_steps'") != std::string::npos        ? "muon-ns-steps"
                                                                            : "muon-ns-schedule";
    throw tr::Cli::error(flag, what);
  }
  return options;
}

fogo::FOGOOptions fogo_options(const OptimizerConfig& c) {
  auto options = fogo::presets::gpt2()
                     .lr(c.matrix_lr.value_or(c.lr))
                     .weight_decay(c.weight_decay)
                     .ns_dtype(fogo::trainer::parse_ns_dtype(c.ns_dtype));
  fogo::trainer::apply_fogo_flags(options, c.ablation, c.fogo_options);
  return options;
}

namespace {

// nanoGPT's AdamW groups: decay for >= 2-D tensors (matrices, embeddings), none for biases and
// LayerNorm weights.
std::unique_ptr<torch::optim::AdamW> adamw(const std::vector<torch::Tensor>& params,
                                           const OptimizerConfig& c) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, options(c.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  return fogo::with_param_groups<fogo::FusedAdamW>(groups, *options(c.weight_decay));
}

// "h.3.attn.c_attn.weight" -> "attn.c_attn": what a codebook holds, whatever the layer.
std::string module_type(const std::string& name) {
  static const std::regex layer(R"(^h\.\d+\.)"), weight(R"(\.weight$)");
  return std::regex_replace(std::regex_replace(name, layer, ""), weight, "");
}

}  // namespace

Optimizer make_optimizer(const OptimizerConfig& c, const torch::nn::Module& model) {
  validate(c);
  if (c.name == "adamw") {
    std::vector<torch::Tensor> params;
    for (const auto& p : model.parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    return {fogo::HybridOptimizer(nullptr, adamw(params, c))};
  }

  // The head is tied to wte (an Embedding), so the default rules already send it to AdamW.
  const fogo::ParamSplit split = fogo::split_parameters(model);
  // One codebook per parameter shape (group_by's shape key), named by the module types it holds:
  // "attn.c_attn", or "a+b" when two share a shape.
  fogo::NamedGroups groups = fogo::group_by(split.matrix, fogo::shape_key);
  std::vector<std::string> names(groups.names.size());
  for (size_t i = 0; i < split.matrix.size(); ++i) {
    const std::string key = fogo::shape_key(split.matrix.names[i], split.matrix.params[i]);
    std::string& name =
        names[std::find(groups.names.begin(), groups.names.end(), key) - groups.names.begin()];
    const std::string type = module_type(split.matrix.names[i]);
    if (name.empty()) {
      name = type;
    } else if (name.find(type) == std::string::npos) {
      name += "+" + type;
    }
  }

  std::unique_ptr<torch::optim::Optimizer> matrix;
  if (c.name == "muon") {
    matrix = std::make_unique<fogo::Muon>(split.matrix.params, muon_options(c));
    names = {"matrices"};
  } else {
    matrix = std::make_unique<fogo::FOGO>(groups.groups, fogo_options(c));
  }
  return {fogo::HybridOptimizer(std::move(matrix), adamw(split.rest.params, c), std::move(names))};
}

}  // namespace gpt2

#include "optimizers.h"

#include <fogo/fogo.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <sstream>
#include <stdexcept>

#include "common/checkpoint.h"
#include "common/fogo_flags.h"
#include "common/optimizers.h"

namespace fogo::resnet {
namespace {

bool is_head(const std::string& stage) { return stage == "head_fc" || stage == "fc"; }

fogo::FOGOOptions preset(const std::string& scenario, const std::string& stage) {
  namespace p = fogo::presets;
  if (scenario == "class-il") {
    if (stage == "fc") return p::class_il_classifier();
    if (stage == "head_fc") return p::class_il_head_fc();
    return p::class_il_backbone();
  }
  if (scenario == "domain-il")
    return is_head(stage) ? p::domain_il_head() : p::domain_il_backbone();
  return is_head(stage) ? p::class_imbalanced_head() : p::class_imbalanced_backbone();
}

std::string lr_text(double lr) {
  std::ostringstream out;
  out << lr;
  return out.str();
}

}  // namespace

fogo::FOGOOptions fogo_group_options(const Config& c, const std::string& stage) {
  auto options = preset(c.scenario, stage);
  options.lr(is_head(stage) ? *c.head_lr : *c.lr)
      .weight_decay(*c.weight_decay)
      .seed(c.seed)
      .ns_dtype(trainer::parse_ns_dtype(c.ns_dtype));
  trainer::apply_fogo_flags(options, c.ablation, c.fogo_options);
  return options;
}

TrainOptimizer::TrainOptimizer(const Config& c, ResNet18& model) : name_(c.optimizer) {
  const double lr = *c.lr, wd = *c.weight_decay;
  const c10::ScalarType ns = trainer::parse_ns_dtype(c.ns_dtype);
  if (c.optimizer == "adam" || c.optimizer == "adamw") {
    if (c.optimizer == "adam") {
      single_ = std::make_unique<torch::optim::Adam>(
          model->parameters(), torch::optim::AdamOptions(lr).weight_decay(wd));
    } else {
      single_ = std::make_unique<torch::optim::AdamW>(
          model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(wd));
    }
    for (const auto& g : single_->param_groups()) base_lrs_.push_back(g.options().get_lr());
    description_ = c.optimizer + " lr " + lr_text(lr) + " on all " +
                   std::to_string(model->parameters().size()) + " tensors";
    return;
  }

  // Every >= 2-D weight, the classifier included, goes to the matrix side: the paper gives the
  // classifier head its own FOGO codebook, and Muon is run on the same split for a like-for-like
  // comparison.
  fogo::ParamSplitRules rules;
  rules.rest_patterns.clear();
  const fogo::ParamSplit split = fogo::split_parameters(*model, rules);
  const auto adamw = torch::optim::AdamWOptions(*c.adamw_lr).weight_decay(wd);
  std::unique_ptr<torch::optim::Optimizer> matrix;
  std::vector<std::string> group_names;  // of the matrix side (empty: the hybrid's defaults)
  std::ostringstream desc;
  const std::string ns_text =
      trainer::describe_ns_dtype(c.ns_dtype, model->parameters().front().device());
  if (c.optimizer == "muon") {
    matrix = std::make_unique<fogo::Muon>(split.matrix.params,
                                          fogo::MuonOptions(lr).weight_decay(wd).ns_dtype(ns));
    desc << "muon lr " << lr << ", NS " << ns_text << ", on " << split.matrix.size() << " matrices";
  } else if (c.optimizer == "fogo") {
    // One codebook group per network stage, named by it.
    fogo::NamedGroups stages = fogo::group_by(
        split.matrix, [](const std::string& name, const torch::Tensor&) { return stage(name); });
    desc << "fogo, NS " << ns_text << ":";
    for (size_t g = 0; g < stages.groups.size(); ++g) {
      const std::string& s = stages.names[g];
      const auto options = fogo_group_options(c, s);
      const double group_lr = options.lr();
      stages.groups[g].set_options(std::make_unique<fogo::FOGOOptions>(options));
      desc << (g ? ", " : " ") << s << " (" << stages.groups[g].params().size() << ", C "
           << options.codebook_size() << ", d " << options.proj_dim() << ", lr " << group_lr << ")";
    }
    matrix = std::make_unique<fogo::FOGO>(stages.groups, fogo_group_options(c, "stem"));
    if (c.ablation != "full") desc << "; ablation " << c.ablation;
    for (const auto& a : c.fogo_options) desc << "; " << a;
    group_names = std::move(stages.names);
  } else {
    throw std::invalid_argument("--optimizers: unknown optimizer '" + c.optimizer + "'");
  }
  desc << "; AdamW lr " << *c.adamw_lr << " on " << split.rest.size() << " other tensors";
  description_ = desc.str();
  std::unique_ptr<torch::optim::Optimizer> rest =
      split.rest.size() ? std::make_unique<torch::optim::AdamW>(split.rest.params, adamw) : nullptr;
  hybrid_ = std::make_unique<fogo::HybridOptimizer>(std::move(matrix), std::move(rest),
                                                    std::move(group_names));
}

TrainOptimizer::~TrainOptimizer() = default;

torch::optim::Optimizer* TrainOptimizer::matrix_optimizer() {
  return hybrid_ ? hybrid_->matrix() : nullptr;
}

void TrainOptimizer::set_lr_factor(double factor) {
  if (hybrid_) hybrid_->set_lr_factor(factor);
  if (single_) {
    auto& groups = single_->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(base_lrs_[g] * factor);
  }
}

const std::vector<torch::optim::OptimizerParamGroup>& TrainOptimizer::param_groups() {
  return single_ ? single_->param_groups() : hybrid_->param_groups();
}

std::vector<std::string> TrainOptimizer::group_names() const {
  if (single_) return std::vector<std::string>(single_->param_groups().size(), "all");
  std::vector<std::string> names;
  for (size_t g = 0; g < hybrid_->param_groups().size(); ++g)
    names.push_back(hybrid_->group_name(g));
  return names;
}

void TrainOptimizer::zero_grad() {
  if (single_) single_->zero_grad(/*set_to_none=*/true);
  if (hybrid_) hybrid_->zero_grad(/*set_to_none=*/true);
}

void TrainOptimizer::step() {
  if (single_) single_->step();
  if (hybrid_) hybrid_->step();
}

void TrainOptimizer::task_boundary() {
  if (name_ == "fogo") hybrid_->matrix<fogo::FOGO>()->task_boundary();
}

void TrainOptimizer::add_telemetry(trainer::Record& record) const {
  if (name_ == "fogo") trainer::add_fogo_telemetry(record, *hybrid_);
}

void TrainOptimizer::save(trainer::CheckpointWriter& out, const std::string& key) const {
  if (single_) out.put_optimizer(key, *single_);
  if (hybrid_) out.put_optimizer(key, *hybrid_);
}

void TrainOptimizer::load(trainer::CheckpointReader& in, const std::string& key) {
  if (single_) in.load_optimizer(key, *single_);
  if (hybrid_) in.load_optimizer(key, *hybrid_);
}

}  // namespace fogo::resnet

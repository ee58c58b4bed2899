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

// --classifier adamw: the classifier's parameters (fc.weight, fc.bias; not head_fc's).
bool is_classifier(const std::string& name) { return name.rfind("fc.", 0) == 0; }

// Two param groups of `params` (named as in `names`): the classifier's at `classifier_lr`, the
// others at the options' own lr; one group when the classifier is not split off.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> with_classifier_group(
    const std::vector<std::string>& names, const std::vector<torch::Tensor>& params,
    const Options& options, const Config& c) {
  std::vector<torch::Tensor> rest, classifier;
  for (size_t k = 0; k < params.size(); ++k) {
    (c.classifier == "adamw" && is_classifier(names[k]) ? classifier : rest).push_back(params[k]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!rest.empty()) groups.emplace_back(rest, std::make_unique<Options>(options));
  if (!classifier.empty()) {
    auto own = std::make_unique<Options>(options);
    own->lr(*c.classifier_lr);
    groups.emplace_back(classifier, std::move(own));
  }
  return groups;
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

namespace {

// What an adam or adamw run trains, for the run's header.
std::string single_description(const Config& c, size_t tensors) {
  std::string text =
      c.optimizer + " lr " + lr_text(*c.lr) + " on all " + std::to_string(tensors) + " tensors";
  if (c.classifier == "adamw")
    text += " but the classifier's (lr " + lr_text(*c.classifier_lr) + ")";
  return text;
}

// The matrix side of a muon run; its description goes to `desc`.
std::unique_ptr<torch::optim::Optimizer> make_muon(const Config& c,
                                                   const fogo::NamedParams& matrices,
                                                   const std::string& ns_text,
                                                   std::ostringstream& desc) {
  const double lr = *c.lr, wd = *c.weight_decay;
  const c10::ScalarType ns = trainer::parse_ns_dtype(c.ns_dtype);
  const fogo::MuonAdjustLR adjust = trainer::parse_muon_adjust(c.muon_adjust);
  auto muon = std::make_unique<fogo::Muon>(
      matrices.params,
      fogo::MuonOptions(lr).weight_decay(wd).ns_dtype(ns).adjust_lr(adjust).normuon(
          c.muon_normuon));
  desc << "muon lr " << lr << " (" << c.muon_adjust << (c.muon_normuon ? ", NorMuon" : "")
       << "), NS " << ns_text << ", on " << matrices.size() << " matrices";
  return muon;
}

// The matrix side of a fogo run: one codebook group per network stage, named by it (into
// `group_names`); its description goes to `desc`.
std::unique_ptr<torch::optim::Optimizer> make_fogo(const Config& c,
                                                   const fogo::NamedParams& matrices,
                                                   const std::string& ns_text,
                                                   std::ostringstream& desc,
                                                   std::vector<std::string>& group_names) {
  fogo::NamedGroups stages = fogo::group_by(
      matrices, [](const std::string& name, const torch::Tensor&) { return stage(name); });
  desc << "fogo, NS " << ns_text << ":";
  for (size_t g = 0; g < stages.groups.size(); ++g) {
    const std::string& s = stages.names[g];
    const auto options = fogo_group_options(c, s);
    const double group_lr = options.lr();
    stages.groups[g].set_options(std::make_unique<fogo::FOGOOptions>(options));
    desc << (g ? ", " : " ") << s << " (" << stages.groups[g].params().size() << ", C "
         << options.codebook_size() << ", d " << options.proj_dim() << ", lr " << group_lr << ")";
  }
  auto fogo = std::make_unique<fogo::FOGO>(stages.groups, fogo_group_options(c, "stem"));
  if (c.ablation != "full") desc << "; ablation " << c.ablation;
  for (const auto& a : c.fogo_options) desc << "; " << a;
  group_names = std::move(stages.names);
  return fogo;
}

}  // namespace

TrainOptimizer::TrainOptimizer(const Config& c, ResNet18& model) : name_(c.optimizer) {
  const double lr = *c.lr, wd = *c.weight_decay;
  if (c.optimizer == "adam" || c.optimizer == "adamw") {
    std::vector<std::string> names;
    std::vector<torch::Tensor> params;
    for (const auto& p : model->named_parameters()) {
      names.push_back(p.key());
      params.push_back(p.value());
    }
    // --classifier adamw: Adam with weight decay 0 is AdamW with weight decay 0, the classifier
    // rule of muon and fogo.
    if (c.optimizer == "adam") {
      const auto options = torch::optim::AdamOptions(lr).weight_decay(wd);
      single_ = fogo::with_param_groups<torch::optim::Adam>(
          with_classifier_group(names, params, options, c), options);
    } else {
      const auto options = torch::optim::AdamWOptions(lr).weight_decay(wd);
      single_ = fogo::with_param_groups<fogo::FusedAdamW>(
          with_classifier_group(names, params, options, c), options);
    }
    for (const auto& g : single_->param_groups()) base_lrs_.push_back(g.options().get_lr());
    description_ = single_description(c, params.size());
    return;
  }

  // Every >= 2-D weight, the classifier included, goes to the matrix side: the paper gives the
  // classifier head its own FOGO codebook, and Muon is run on the same split for a like-for-like
  // comparison.
  // --classifier adamw sends the classifier to the AdamW side, in a group of its own.
  fogo::ParamSplitRules rules;
  rules.rest_patterns.clear();
  if (c.classifier == "adamw") rules.rest_patterns = {R"(^fc\.)"};
  const fogo::ParamSplit split = fogo::split_parameters(*model, rules);
  rules_ = rules;
  const auto adamw = torch::optim::AdamWOptions(*c.adamw_lr).weight_decay(wd);
  std::unique_ptr<torch::optim::Optimizer> matrix;
  std::vector<std::string> group_names;  // of the matrix side (empty: the hybrid's defaults)
  std::ostringstream desc;
  const std::string ns_text =
      trainer::describe_ns_dtype(c.ns_dtype, model->parameters().front().device());
  if (c.optimizer == "muon") {
    matrix = make_muon(c, split.matrix, ns_text, desc);
  } else if (c.optimizer == "fogo") {
    matrix = make_fogo(c, split.matrix, ns_text, desc, group_names);
  } else {
    throw std::invalid_argument("--optimizers: unknown optimizer '" + c.optimizer + "'");
  }
  desc << "; AdamW lr " << *c.adamw_lr << " on " << split.rest.size() << " other tensors";
  if (c.classifier == "adamw") desc << " (the classifier's at lr " << *c.classifier_lr << ")";
  description_ = desc.str();
  std::unique_ptr<torch::optim::Optimizer> rest =
      split.rest.size()
          ? fogo::with_param_groups<fogo::FusedAdamW>(
                with_classifier_group(split.rest.names, split.rest.params, adamw, c), adamw)
          : nullptr;
  hybrid_ = std::make_unique<fogo::HybridOptimizer>(std::move(matrix), std::move(rest),
                                                    std::move(group_names));
}

TrainOptimizer::~TrainOptimizer() = default;

std::string TrainOptimizer::routing_table(const torch::nn::Module& model) const {
  return hybrid_ ? fogo::routing_table(hybrid_->routes(model, rules_)) : std::string();
}

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
  if (single_) {
    std::vector<std::string> names{"all"};  // --classifier adamw: and "classifier"
    if (single_->param_groups().size() > 1) names.push_back("classifier");
    return names;
  }
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

void TrainOptimizer::save(CheckpointWriter& out, const std::string& key) const {
  if (single_) out.put_optimizer(key, *single_);
  if (hybrid_) out.put_optimizer(key, *hybrid_);
}

void TrainOptimizer::load(CheckpointReader& in, const std::string& key) {
  if (single_) in.load_optimizer(key, *single_);
  if (hybrid_) in.load_optimizer(key, *hybrid_);
}

}  // namespace fogo::resnet

#pragma once
// The four update rules of the trainer behind one interface:
//   adam, adamw   LibTorch's, on every parameter
//   muon          fogo::Muon on every >= 2-D weight (convs as [out, in*k*k], the classifier too),
//                 AdamW on BatchNorm weights and biases
//   fogo          fogo::FOGO likewise, one codebook group per network stage (stem, layer1..4,
//                 head_fc, fc) with the paper's preset for the scenario and stage:
//                   class-imbalanced  backbone stages: class_imbalanced_backbone;
//                                     head_fc, fc: class_imbalanced_head
//                   class-il          backbone: class_il_backbone; head_fc: class_il_head_fc;
//                                     fc: class_il_classifier (both heads at --head-lr)
//                   domain-il         backbone: domain_il_backbone; head_fc, fc: domain_il_head
// Muon and FOGO run their Newton–Schulz iterations in --ns-dtype (bf16 or fp32).

#include <fogo/fogo_options.h>
#include <fogo/routing.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "resnet.h"

namespace fogo {
class HybridOptimizer;
class CheckpointWriter;
class CheckpointReader;
}  // namespace fogo
namespace fogo::trainer {
class Record;
}  // namespace fogo::trainer

namespace fogo::resnet {

/// The FOGOOptions of the codebook group of network stage `stage` (stem, layer1..4, head_fc, fc)
/// in a fogo run of `resolved`: the paper's preset for the scenario and stage, the trainer's
/// lr (--head-lr for the heads), weight decay, seed and --ns-dtype, then --ablation and every
/// --fogo key=value. Throws a trainer::CliError naming --fogo or --ablation when they are bad.
fogo::FOGOOptions fogo_group_options(const Config& resolved, const std::string& stage);

class TrainOptimizer {
 public:
  /// Builds the optimizer a resolved config asks for over `model`'s parameters.
  TrainOptimizer(const Config& config, ResNet18& model);
  ~TrainOptimizer();

  /// Sets every param group's lr to its initial lr * factor (the schedule's handle).
  void set_lr_factor(double factor);
  void zero_grad();
  void step();
  /// End of a task in the continual scenarios: FOGO consolidates its codebooks and starts the
  /// next task (fogo::FOGO::task_boundary()); the other rules have nothing to do.
  void task_boundary();
  /// FOGO's per-group statistics of the last step as "fogo/<stage>/<stat>" fields
  /// (trainer::add_fogo_telemetry).
  void add_telemetry(trainer::Record& record) const;
  /// The hybrid of muon and fogo: its matrix side (fogo::Muon, fogo::FOGO) with one param group
  /// per network stage (fogo: named by the stage), AdamW on the rest; null for adam and adamw.
  fogo::HybridOptimizer* hybrid() { return hybrid_.get(); }
  /// The matrix side of muon and fogo (fogo::Muon, fogo::FOGO); null for adam and adamw.
  torch::optim::Optimizer* matrix_optimizer();
  /// Every param group of the rule (adam/adamw: one; muon/fogo: the hybrid's, matrix groups
  /// first) and their names ("all"; the hybrid's group_name()).
  const std::vector<torch::optim::OptimizerParamGroup>& param_groups();
  std::vector<std::string> group_names() const;
  /// One line: the rule, its parameter groups and learning rates.
  const std::string& description() const { return description_; }
  /// muon and fogo: the hybrid's routing table over `model` (fogo::routing_table of
  /// HybridOptimizer::routes under the split's rules: each parameter's side, rule, group and
  /// update scale); empty for adam and adamw.
  std::string routing_table(const torch::nn::Module& model) const;

  void save(CheckpointWriter& out, const std::string& key) const;
  void load(CheckpointReader& in, const std::string& key);

 private:
  std::string name_;  ///< adam | adamw | muon | fogo
  std::unique_ptr<torch::optim::Optimizer> single_;
  std::unique_ptr<fogo::HybridOptimizer> hybrid_;
  fogo::ParamSplitRules rules_;  ///< the hybrid's split
  std::string description_;
  std::vector<double> base_lrs_;  ///< of single_'s groups
};

}  // namespace fogo::resnet

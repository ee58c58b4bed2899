// Param groups exactly as given (param_groups.h).
#include "fogo/param_groups.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

namespace fogo {

void add_param_group(torch::optim::Optimizer& optimizer,
                     const torch::optim::OptimizerParamGroup& group) {
  if (auto* fogo_optimizer = dynamic_cast<ExactParamGroups*>(&optimizer)) {
    fogo_optimizer->add_param_group_exactly(group);
  } else {
    detail::add_param_group_as_given(optimizer, group);
  }
}

void detail::add_param_group_as_given(torch::optim::Optimizer& optimizer,
                                      const torch::optim::OptimizerParamGroup& group) {
  // LibTorch's own checks (leaf tensors, a parameter in two groups) and bookkeeping first; then
  // the options it may have rebuilt are replaced by the group's own.
  optimizer.add_param_group(group);
  if (group.has_options()) optimizer.param_groups().back().set_options(group.options().clone());
}

namespace {

// A minimal optimizer of a type torch does not know, to see what add_param_group does with it.
struct ProbeOptions : torch::optim::OptimizerCloneableOptions<ProbeOptions> {
  explicit ProbeOptions(double lr = 1.0) : lr_(lr) {}
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
  double lr_;
};

struct ProbeOptimizer : torch::optim::Optimizer {
  using torch::optim::Optimizer::Optimizer;
  torch::Tensor step(LossClosure) override { return {}; }
};

}  // namespace

bool torch_keeps_group_options() {
  static const bool keeps = [] {
    ProbeOptimizer probe(std::vector<torch::optim::OptimizerParamGroup>{},
                         std::make_unique<ProbeOptions>(1.0));
    probe.add_param_group(
        torch::optim::OptimizerParamGroup({at::zeros({1})}, std::make_unique<ProbeOptions>(2.0)));
    return probe.param_groups().at(0).options().get_lr() == 2.0;
  }();
  return keeps;
}

namespace detail {

void check_groups_added_exactly(const char* who,
                                const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                size_t exact) {
  if (groups.size() <= exact || torch_keeps_group_options()) return;
  TORCH_CHECK(
      false, who, ": param group ", exact,
      " was added through torch::optim::Optimizer::add_param_group, which in this "
      "LibTorch (",
      TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
      ") replaces the group's own options by the optimizer's defaults, so its options are "
      "lost; add it through ",
      who, "::add_param_group (on the ", who,
      " itself, not a torch::optim::Optimizer&) or fogo::add_param_group(optimizer, group)");
}

}  // namespace detail

}  // namespace fogo

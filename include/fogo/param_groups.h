#pragma once
// Param groups exactly as given, on every LibTorch.
//
// torch::optim::Optimizer::add_param_group (not virtual; the Optimizer constructor calls it too)
// changed between torch 2.11 and 2.15. On 2.11 a group keeps the options it is given. On 2.15 a
// group's options are rebuilt from the optimizer's defaults: for torch's own option types
// (SGD, Adam, AdamW, Adagrad, RMSprop, LBFGS) a value equal to the options constructor's default
// is taken from the defaults instead (AdamWOptions().lr(1e-3) in a group of an AdamW whose
// defaults say 3e-4 steps at 3e-4), and any other optimizer's group (FOGO's, Muon's, the
// hybrid's) gets the defaults whole, with no error. fogo adds every group through
// fogo::add_param_group, which keeps exactly what it was given, on every version.
//
// FOGO, Muon (MatrixOptimizer) and HybridOptimizer have an add_param_group member that does this.
// A group added around it, through a torch::optim::Optimizer& on a torch that drops options, is
// refused at the next step naming the group (its options are already lost): silent defaults are
// never stepped.

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

namespace fogo {

/// What fogo's optimizers (FOGO, Muon, the hybrid) implement: adding a group with exactly its
/// options and keeping what else they hold per group; fogo::add_param_group calls it.
class ExactParamGroups {
 public:
  virtual ~ExactParamGroups() = default;
  virtual void add_param_group_exactly(const torch::optim::OptimizerParamGroup& group) = 0;
};

/// Adds `group` to `optimizer` with exactly its own options (a copy), or the optimizer's
/// defaults when it has none: what torch 2.11's add_param_group did. Through a
/// torch::optim::Optimizer& this is the way to add a group to a fogo optimizer.
void add_param_group(torch::optim::Optimizer& optimizer,
                     const torch::optim::OptimizerParamGroup& group);

namespace detail {
/// torch::optim::Optimizer::add_param_group, then the group's own options put back.
void add_param_group_as_given(torch::optim::Optimizer& optimizer,
                              const torch::optim::OptimizerParamGroup& group);
}  // namespace detail

/// Whether this LibTorch's Optimizer::add_param_group keeps a group's own options for an
/// optimizer that is not one of torch's (true on torch 2.11, false on 2.15), measured once on a
/// probe optimizer.
bool torch_keeps_group_options();

/// A T (a torch::optim optimizer constructed from (param groups, defaults): AdamW, Adam, SGD, ...)
/// whose groups have exactly their own options on every torch version.
template <class T, class Options>
std::unique_ptr<T> with_param_groups(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                     Options defaults) {
  auto optimizer =
      std::make_unique<T>(std::vector<torch::optim::OptimizerParamGroup>{}, std::move(defaults));
  for (const auto& group : groups) add_param_group(*optimizer, group);
  return optimizer;
}

namespace detail {
/// Throws naming the first group from `exact` on of `who`'s `groups`: groups added around
/// fogo::add_param_group on a torch that drops their options. `exact`: how many groups were added
/// through it.
void check_groups_added_exactly(const char* who,
                                const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                size_t exact);
}  // namespace detail

}  // namespace fogo

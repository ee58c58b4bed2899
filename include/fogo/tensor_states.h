#pragma once
// A generic checkpoint for a matrix optimizer whose per-parameter state is a few named tensors
// (a momentum buffer, a second moment): what a new optimizer on the frame (GroupFrame,
// matrix_optimizer.h) gets without writing its own format. fogo::Muon and fogo::FOGO keep their own
// formats (LibTorch's archive of their param states, option tables); this one holds, under
// `<prefix>/`:
//   format                1
//   groups                the number of param groups; group/<g>/params their sizes
//   group/<g>/lr          each group's learning rate (the other options are the constructor's)
//   state/<g>/<i>/<name>  each named tensor of parameter i of group g with state
//   checksum              a checksum over all of the above, verified on load
// Loading is all-or-nothing (load_transactional): a checkpoint for another layout, with a shape
// that is not the parameter's, a non-finite value or a damaged byte changes nothing.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fogo {

/// A parameter's state as named tensors, and back.
struct TensorStates {
  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  /// The names of every state's tensors, in order (each must be defined in a saved state).
  std::vector<std::string> names;
  std::function<Named(const torch::optim::OptimizerParamState&)> get;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const Named&)> make;
};

void save_tensor_states(const torch::optim::Optimizer& optimizer,
                        torch::serialize::OutputArchive& archive, const std::string& prefix,
                        const TensorStates& states);

/// Each tensor is checked to be finite and of its parameter's shape (`same_shape`, for names
/// whose tensor is the parameter's shape; the others are taken as they are) and moved to its
/// parameter's device. `who` names the optimizer in errors.
void load_tensor_states(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                        const std::string& prefix, const TensorStates& states,
                        const std::function<bool(const std::string&)>& same_shape, const char* who);

}  // namespace fogo

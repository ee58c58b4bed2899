#pragma once
// fogo::dist's broadcasts and lockstep checks: every rank starting from, and staying at, the
// same values. Part of fogo/distributed.h.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fogo/distributed/process_group.h"

namespace fogo {
class FOGO;
}  // namespace fogo

namespace fogo::dist {

/// Copies root's values of `tensors` into every rank's (in place, without autograd). Collective;
/// the tensors must have the same shapes and dtypes on every rank (checked).
void broadcast_tensors(const ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                       int64_t root = 0);
/// broadcast_tensors of a module's parameters and buffers: every rank starts from root's model.
void broadcast_parameters(const ProcessGroup& group, const torch::nn::Module& module,
                          int64_t root = 0);

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// A module's parameters and buffers by name.
NamedTensors module_state(const torch::nn::Module& module);
/// FOGO's memory (FOGO::memory) by name: "fogo.group<g>.centroids", ".S", ".N", ".frozen",
/// ".frozen_nu" (those that exist yet).
NamedTensors fogo_memory(const fogo::FOGO& optimizer);

/// Checks that every rank holds bit-identical `tensors`: a checksum of each tensor's bytes
/// (exact integer sums, the same on every device) is gathered from all ranks. A difference is a
/// c10::Error on every rank naming the first tensor that differs and the ranks that disagree
/// with rank 0. Collective; run it every N steps in replicated training.
void check_lockstep(const ProcessGroup& group, const NamedTensors& tensors);

}  // namespace fogo::dist

// fogo::Muon: the frame's hooks (construction, checks, state, the tensors the step touches) and
// the device step of one group: momenta, orthogonalization (orthogonalize.h), the update.
// Row-sharded steps: rows.cpp; checkpoints: checkpoint.cpp.
#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

#include "fogo/muon.h"
#include "fogo/newton_schulz.h"
#include "fogo_private/frame/batching.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/graphed_step.h"
#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/nonfinite.h"
#include "fogo_private/frame/options_table.h"
#include "fogo_private/muon/normuon.h"
#include "fogo_private/muon/orthogonalize.h"
#include "fogo_private/muon/update.h"
#include "fogo_private/newton_schulz/dtype_record.h"
#include "fogo_private/ops/ops.h"

namespace fogo {

using detail::muon::Matrix;
using detail::muon::momentum_updates;
using detail::muon::orthogonalize_matrices;

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : MatrixOptimizerOf(param_groups, defaults) {
  defaults.validate();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
    options.validate();
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      check_param_shape(g, i, param_groups_[g].params()[i], options);
    }
  }
}

Muon::~Muon() = default;
Muon::Muon(Muon&&) noexcept = default;
Muon& Muon::operator=(Muon&&) noexcept = default;

void Muon::check_param_shape(size_t group, size_t index, const torch::Tensor& p,
                             const MuonOptions& options) const {
  if (options.cuda_graph()) detail::check_graph_device("Muon", group, index, p);
  if (options.strict_2d()) {
    // With batch_dims, the matrices of a stack are what must be 2-D.
    TORCH_CHECK(p.dim() == 2 + options.batch_dims(),
                "Muon only supports 2D parameters whereas we found a parameter with size: ",
                p.sizes(), " (", detail::describe_param(group, index, p),
                "; set strict_2d(false) to accept N-D weights as [shape0, prod(rest)])");
  } else {
    TORCH_CHECK(
        p.dim() >= 2, "Muon handles matrices and N-D weights, but ",
        detail::describe_param(group, index, p),
        " has fewer than 2 dimensions; optimize it with AdamW (see fogo::split_parameters)");
  }
  fogo::matrix_view(p.sizes(), matrix_layout(options), "Muon",
                    detail::describe_param(group, index, p));
}

void Muon::check_param(size_t g, size_t i, const at::Tensor& p) const {
  check_param_shape(g, i, p, options(g));
  if (const auto it = state_.find(p.unsafeGetTensorImpl()); it != state_.end()) {
    detail::check_state_shape("Muon", g, i, p,
                              static_cast<const MuonParamState&>(*it->second).momentum_buffer(),
                              "momentum_buffer");
  }
}

std::vector<at::Tensor> Muon::buffers(const std::vector<at::Tensor>& params,
                                      bool second_moments) const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) {
    const auto& st = static_cast<const MuonParamState&>(*state_.at(p.unsafeGetTensorImpl()));
    out.push_back(second_moments ? st.second_moment() : st.momentum_buffer());
  }
  return out;
}

void Muon::create_state(const GroupStep& s) {
  const auto& o = options(s.group);
  for (size_t k = 0; k < s.params.size(); ++k) {
    const at::Tensor& p = s.params[k];
    auto& slot = state_[p.unsafeGetTensorImpl()];
    if (!slot) {
      auto fresh = std::make_unique<MuonParamState>();
      fresh->momentum_buffer(torch::zeros_like(s.grads[k], at::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
    auto& st = static_cast<MuonParamState&>(*slot);
    if (o.normuon() && !st.second_moment().defined()) {
      st.second_moment(fresh_second_moment(p, o.batch_dims()));
    }
  }
}

std::vector<at::Tensor> Muon::touched(const GroupStep& s) const {
  std::vector<at::Tensor> touched = s.params;
  for (const bool second : {false, true})
    for (const at::Tensor& b : buffers(s.params, second))
      if (b.defined()) touched.push_back(b);
  return touched;
}

std::vector<at::Tensor> Muon::masked_tensors(const StepInputs& in) const {
  // The parameters are not copied: the update takes the flag and leaves them as they are (issue
  // 44).
  std::vector<at::Tensor> changed = buffers(in.params);
  if (options(in.group).normuon()) {
    const std::vector<at::Tensor> second = buffers(in.params, true);
    changed.insert(changed.end(), second.begin(), second.end());
  }
  return changed;
}

// Sharded: with its matrix, its rows of NorMuon's second moment, which only the owner updates
// (every rank holds one where normuon is on: the options and the state's keys are the same on
// every rank).
std::vector<at::Tensor> Muon::shard_values(size_t g, const at::Tensor& param,
                                           const MatrixView& view, int64_t k) const {
  if (!options(g).normuon()) return {};
  return {matrix_of(buffers({param}, true)[0], view, k)};
}

MatrixView Muon::matrix_view(size_t group, const at::Tensor& param) const {
  std::ostringstream what;
  what << "a parameter of group " << group << " (shape " << param.sizes() << ")";
  return fogo::matrix_view(param.sizes(), matrix_layout(options(group)), "Muon", what.str());
}

void Muon::device_step(const StepInputs& in) {
  const size_t g = in.group;
  const std::vector<at::Tensor>& params = in.params;
  const auto& o = options(g);
  const std::vector<at::Tensor> bufs = buffers(params);
  const std::vector<at::Tensor> second = buffers(params, true);  // NorMuon's, or undefined
  // The momenta of every parameter, elementwise (the same bits however they are grouped).
  const std::vector<at::Tensor> U = momentum_updates(bufs, in.grads, o);
  // Every matrix of every parameter (sharded: the owned ones only go through Newton–Schulz and
  // the update).
  std::vector<MatrixView> views;
  std::vector<Matrix> matrices;
  for (size_t i = 0; i < params.size(); ++i) {
    views.push_back(matrix_view(g, params[i]));
    for (int64_t k = 0; k < views[i].count(); ++k) {
      if (owns(params[i], k)) matrices.push_back({i, k, views[i].rows_of(k), views[i].cols});
    }
  }
  std::vector<MuonUpdateItem> updates;  // each (owned) matrix with its orthogonalized momentum
  orthogonalize_matrices(matrices, views, U, second, o, [&](const Matrix& m, const at::Tensor& O) {
    updates.push_back({matrix_of(params[m.param], views[m.param], m.k), O});
  });
  // Every run's update in one call: on CUDA one multi-tensor kernel per dtype pair (the learning
  // rate read on the device in a graph), elsewhere torch.optim.Muon's ops. Each matrix takes the
  // adjusted learning rate of its own shape.
  ops::muon_update(updates,
                   {in.lr, o.weight_decay(), o.adjust_lr(), in.ok, o.extra_scale_factor()});
}
}  // namespace fogo

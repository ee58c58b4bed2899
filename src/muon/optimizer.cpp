// fogo::Muon: the frame's hooks (construction, checks, state, graph or eager) and the step of one
// group: momenta, orthogonalization (orthogonalize.h), the update. Row-sharded steps: rows.cpp;
// checkpoints: checkpoint.cpp.
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

// MuonOptions::cuda_graph: each group's captured step.
struct Muon::Graphs {
  std::map<size_t, detail::GroupGraph<MuonOptions>> groups;
  detail::GroupGraph<MuonOptions>& of(size_t g) { return groups[g]; }
};

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : MatrixOptimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
      graphs_(std::make_unique<Graphs>()) {
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

NonFinitePolicy Muon::nonfinite(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "Muon::nonfinite: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  return options(group).nonfinite();
}

NonFinitePolicy Muon::default_nonfinite() const {
  return static_cast<const MuonOptions&>(defaults()).nonfinite();
}

double Muon::weight_decay(size_t g) const { return options(g).weight_decay(); }

const MuonOptions& Muon::options(size_t g) const {
  return static_cast<const MuonOptions&>(param_groups_[g].options());
}

void Muon::check_group(size_t g) const { options(g).validate(); }

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

void Muon::step_group(const GroupStep& s) {
  const auto& o = options(s.group);
  for (size_t k = 0; k < s.params.size(); ++k) {  // state created on the host, before device work
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
  auto& graph = graphs_->of(s.group);
  const bool graphed = o.cuda_graph() && !shard_.enabled("Muon") && !graph.step.failed();
  detail::run_group(
      graph, graphed, o,
      [&] {  // what the work touches besides the static inputs
        std::vector<at::Tensor> touched = s.params;
        for (const bool second : {false, true})
          for (const at::Tensor& b : buffers(s.params, second))
            if (b.defined()) touched.push_back(b);
        return touched;
      },
      {s.grads, {s.ok}, {}}, s.params.front().device(),
      [&](const detail::GraphedStep::Inputs& in) {
        update_group(s.group, s.params, in.grads, in.tensors[0], in.lr);
      },
      [&] {  // what the update's host code may change, for a failed capture to put back
        auto states = std::make_shared<detail::SavedStates>(*this, s.params);
        return std::function<void()>([states] { states->restore(); });
      },
      "Muon", s.group);
}

void Muon::finish_step(const std::vector<GroupStep>& groups) {
  if (!shard_.enabled("Muon")) return;
  // Every matrix of every parameter with a gradient from its owner (a collective: every rank
  // calls it; the experts of a stack may have several owners), with its rows of NorMuon's second
  // moment, which only the owner updates (every rank holds one where normuon is on: the options
  // and the state's keys are the same on every rank).
  std::vector<ShardUnit> units;
  std::vector<std::vector<at::Tensor>> values;
  for (const GroupStep& s : groups) {
    const std::vector<at::Tensor> second = buffers(s.params, true);
    for (size_t i = 0; i < s.params.size(); ++i) {
      const MatrixView view = matrix_view(s.group, s.params[i]);
      for (int64_t k = 0; k < view.count(); ++k) {
        units.push_back({s.params[i], k});
        values.push_back({matrix_of(s.params[i], view, k)});
        if (options(s.group).normuon()) values.back().push_back(matrix_of(second[i], view, k));
      }
    }
  }
  shard_.exchange(units, values);
}
MatrixView Muon::matrix_view(size_t group, const at::Tensor& param) const {
  std::ostringstream what;
  what << "a parameter of group " << group << " (shape " << param.sizes() << ")";
  return fogo::matrix_view(param.sizes(), matrix_layout(options(group)), "Muon", what.str());
}

void Muon::update_group(size_t g, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& grads, const at::Tensor& ok,
                        const at::Tensor& device_lr) {
  const auto& o = options(g);
  const std::vector<at::Tensor> bufs = buffers(params);
  const std::vector<at::Tensor> second = buffers(params, true);  // NorMuon's, or undefined
  // Mask: what the step changes before the update (nothing to copy without it). The parameters
  // are not copied: the update takes the flag and leaves them as they are (issue 44).
  std::vector<at::Tensor> changed;
  if (ok.defined()) {
    changed = bufs;
    if (o.normuon()) changed.insert(changed.end(), second.begin(), second.end());
  }
  const detail::MaskScope keep(ok, std::move(changed));
  // The momenta of every parameter, elementwise (the same bits however they are grouped).
  const std::vector<at::Tensor> U = momentum_updates(bufs, grads, o);
  // Every matrix of every parameter (sharded: the owned ones only go through Newton–Schulz and
  // the update).
  std::vector<MatrixView> views;
  std::vector<Matrix> matrices;
  for (size_t i = 0; i < params.size(); ++i) {
    views.push_back(matrix_view(g, params[i]));
    for (int64_t k = 0; k < views[i].count(); ++k) {
      if (!shard_.owns || shard_.owns(params[i], k))
        matrices.push_back({i, k, views[i].rows_of(k), views[i].cols});
    }
  }
  std::vector<MuonUpdateItem> updates;  // each (owned) matrix with its orthogonalized momentum
  orthogonalize_matrices(matrices, views, U, second, o, [&](const Matrix& m, const at::Tensor& O) {
    updates.push_back({matrix_of(params[m.param], views[m.param], m.k), O});
  });
  // Every run's update in one call: on CUDA one multi-tensor kernel per dtype pair (the learning
  // rate read on the device in a graph), elsewhere torch.optim.Muon's ops. Each matrix takes the
  // adjusted learning rate of its own shape.
  const at::ScalarType lr_dtype = g < lr_dtypes_.size() ? lr_dtypes_[g] : at::kDouble;
  ops::muon_update(updates, {o.lr(), o.weight_decay(), o.adjust_lr(), device_lr, lr_dtype, ok,
                             o.extra_scale_factor()});
  keep.restore();
}
Muon::GraphStats Muon::graph_stats(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "Muon::graph_stats: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  const auto it = graphs_->groups.find(group);
  if (it == graphs_->groups.end()) return {};
  return {it->second.step.captures(), it->second.step.replays()};
}

void Muon::set_lr_dtype(size_t group, at::ScalarType dtype) {
  TORCH_CHECK(group < param_groups_.size(), "Muon::set_lr_dtype: group ", group,
              " does not exist (", param_groups_.size(), " groups)");
  if (lr_dtypes_.size() <= group) lr_dtypes_.resize(group + 1, at::kDouble);
  lr_dtypes_[group] = dtype;
}

void Muon::set_step_shard(StepShard shard) {
  shard.enabled("Muon::set_step_shard");
  shard_ = std::move(shard);
}
}  // namespace fogo

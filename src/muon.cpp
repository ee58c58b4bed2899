#include "fogo/muon.h"

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include "fogo/detail/batching.h"
#include "fogo/detail/checks.h"
#include "fogo/newton_schulz.h"
#include "fogo/ops.h"
#include "graphed_step.h"

namespace fogo {

std::pair<double, double> muon_adjusted_lr_factors(MuonAdjustLR rule, int64_t A, int64_t B) {
  switch (rule) {
    case MuonAdjustLR::Original:
      return {std::sqrt(std::max(1.0, static_cast<double>(A) / static_cast<double>(B))), 1.0};
    case MuonAdjustLR::MatchRmsAdamW:
      // torch.optim.Muon's order, lr * (0.2 * sqrt(max(A, B))): lr * 0.2 * sqrt(...) rounds
      // differently, which float64 parameters show.
      return {0.2 * std::sqrt(static_cast<double>(std::max(A, B))), 1.0};
  }
  TORCH_CHECK(false, "Muon: unknown adjust_lr rule ", static_cast<int64_t>(rule));
}

double muon_adjusted_lr(double lr, MuonAdjustLR rule, int64_t A, int64_t B) {
  // lr f1 f2, left to right: lr * ratio (times 1, exact), as torch.optim.Muon's _adjust_lr.
  const auto [f1, f2] = muon_adjusted_lr_factors(rule, A, B);
  return lr * f1 * f2;
}

void muon_update(const std::vector<MuonUpdateItem>& items, const MuonUpdateParams& p) {
  if (items.empty()) return;
  const auto matrix = [](const at::Tensor& param) {
    const int64_t rows = param.size(0);
    return std::pair{rows, param.numel() / std::max<int64_t>(rows, 1)};
  };
  if (!p.device_lr.defined()) {
    // torch.optim.Muon's ops, per tensor, as Python dispatches them: `param.mul_(float)` is
    // mul_.Tensor with a wrapped 0-d double. C++'s mul_(double) (mul_.Scalar) and _foreach_mul_
    // round a bf16 parameter's product differently (1-4 bf16 ulps per step, measured).
    at::Tensor decay = at::scalar_tensor(1.0 - p.lr * p.weight_decay, at::kDouble);
    decay.unsafeGetTensorImpl()->set_wrapped_number(true);
    for (const MuonUpdateItem& item : items) {
      item.param.mul_(decay.to(item.param.device()));
      const auto [rows, cols] = matrix(item.param);
      item.param.add_(item.O.reshape(item.param.sizes()),
                      -muon_adjusted_lr(p.lr, p.adjust_lr, rows, cols));
    }
    return;
  }
  // A CUDA graph's learning rate, read on the device: the same update in the parameter's
  // precision (fp32 for bf16/fp16 ones, one rounding at the end), to rounding.
  const at::Tensor decay = 1.0 - p.device_lr * p.weight_decay;
  for (const MuonUpdateItem& item : items) {
    const at::Tensor& param = item.param;
    const auto [rows, cols] = matrix(param);
    const auto [f1, f2] = muon_adjusted_lr_factors(p.adjust_lr, rows, cols);
    const at::Tensor step = p.device_lr * f1 * f2;
    const auto type = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor o = item.O.reshape(param.sizes()).to(type);
    param.copy_(param.to(type) * decay.to(type) - o * step.to(type));
  }
}

// ---------------------------------------------------------------------------------------------
// State

bool operator==(const MuonParamState& a, const MuonParamState& b) {
  const auto& x = a.momentum_buffer();
  const auto& y = b.momentum_buffer();
  return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
}

void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

// ---------------------------------------------------------------------------------------------
// Optimizer

// MuonOptions::cuda_graph: each group's captured step.
struct Muon::Graphs {
  std::map<size_t, detail::GroupGraph<MuonOptions>> groups;
  detail::GroupGraph<MuonOptions>& of(size_t g) { return groups[g]; }
};

Muon::Muon(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, MuonOptions defaults)
    : Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
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
    TORCH_CHECK(p.dim() == 2,
                "Muon only supports 2D parameters whereas we found a parameter with size: ",
                p.sizes(), " (", detail::describe_param(group, index, p),
                "; set strict_2d(false) to accept N-D weights as [shape0, prod(rest)])");
  } else {
    TORCH_CHECK(
        p.dim() >= 2, "Muon handles matrices and N-D weights, but ",
        detail::describe_param(group, index, p),
        " has fewer than 2 dimensions; optimize it with AdamW (see fogo::split_parameters)");
  }
}

torch::Tensor Muon::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }

  // Validate everything before touching any parameter, so a bad input changes nothing.
  const detail::GradItems items = detail::collect_grads(
      "Muon", param_groups_,
      [&](size_t g) { static_cast<const MuonOptions&>(param_groups_[g].options()).validate(); },
      [&](size_t g, size_t i, const at::Tensor& p) {
        check_param_shape(g, i, p, static_cast<const MuonOptions&>(param_groups_[g].options()));
        if (const auto it = state_.find(p.unsafeGetTensorImpl()); it != state_.end()) {
          detail::check_state_shape(
              "Muon", g, i, p, static_cast<const MuonParamState&>(*it->second).momentum_buffer(),
              "momentum_buffer");
        }
      });
  const auto policy = [&](size_t g) {
    return static_cast<const MuonOptions&>(param_groups_[g].options()).nonfinite();
  };
  if (const int64_t k = detail::first_unusable_item(items,
                                                    [&](size_t g) {
                                                      return policy(g) == NonFinitePolicy::Raise ||
                                                             policy(g) == NonFinitePolicy::Skip;
                                                    });
      k >= 0) {
    if (policy(items.where[k].first) == NonFinitePolicy::Skip) return loss;
    detail::throw_unusable_grad("Muon", items.where[k].first, items.where[k].second,
                                items.params[k]);
  }
  // Mask: one flag for the step, true when every gradient of the masked groups is usable; their
  // parameters and momentum buffers are copied before the step and put back where it is false.
  std::vector<at::Tensor> masked_grads;
  for (size_t k = 0; k < items.grads.size(); ++k) {
    if (policy(items.where[k].first) == NonFinitePolicy::Mask)
      masked_grads.push_back(items.grads[k]);
  }
  const at::Tensor ok = detail::grads_usable(masked_grads);

  const bool sharded = shard_.enabled("Muon");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
    std::vector<at::Tensor> params, grads;
    for (const auto& p : param_groups_[g].params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
      auto& slot = state_[p.unsafeGetTensorImpl()];  // created on the host, before the stages
      if (!slot) {
        auto fresh = std::make_unique<MuonParamState>();
        fresh->momentum_buffer(torch::zeros_like(p.grad(), at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
    }
    if (params.empty()) continue;
    const at::Tensor group_ok = options.nonfinite() == NonFinitePolicy::Mask ? ok : at::Tensor();
    if (options.cuda_graph() && !sharded && !graphs_->of(g).step.failed()) {
      graph_group(g, params, grads, group_ok);
    } else {
      step_group(g, params, grads, group_ok, {});
    }
  }
  if (sharded) {
    std::vector<std::vector<torch::Tensor>> values;
    for (const auto& p : items.params) values.push_back({p});
    shard_.exchange(items.params, values);
  }
  return loss;
}

void Muon::step_group(size_t g, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& grads, const at::Tensor& ok,
                      const at::Tensor& device_lr) {
  const auto& options = static_cast<const MuonOptions&>(param_groups_[g].options());
  const NSConfig ns = ns_config(options);
  const double lr = options.lr();
  const double momentum = options.momentum();
  const bool sharded = static_cast<bool>(shard_.owns);
  // Mask: the group's parameters and momentum buffers, copied before the step and put back
  // where ok is false.
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;  // (tensor, its copy)

  // On a GPU, one Newton–Schulz chain per matrix shape: each run's updates go through a
  // single batched chain, which fills the GPU where one small GEMM per parameter cannot (tall
  // and wide shapes stay apart; newton_schulz transposes tall ones itself). On the CPU every
  // parameter takes its own chain, as torch.optim.Muon does: batching gains nothing there
  // (the GEMMs are compute-bound), and ATen's CPU bmm can round differently from mm on small
  // matrices, which would break the bit-identity with PyTorch.
  // The shape key: the matrix view [rows, numel / rows] and the device; on the CPU each
  // parameter's position too, so that every run there is one parameter.
  std::map<const void*, size_t> position;
  for (size_t k = 0; k < params.size(); ++k) position[params[k].unsafeGetTensorImpl()] = k;
  const auto key = [&](const torch::Tensor& p) {
    const int64_t rows = p.size(0), cols = p.numel() / std::max<int64_t>(rows, 1);
    const size_t alone = p.is_cuda() ? 0 : position.at(p.unsafeGetTensorImpl());
    return std::make_tuple(alone, static_cast<int>(p.device().type()), p.device().index(), rows,
                           cols);
  };
  std::vector<size_t> order(params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  const detail::Runs runs = detail::sort_into_runs(order, [&](size_t k) { return key(params[k]); });
  std::vector<MuonUpdateItem> updates_of;  // each parameter with its orthogonalized momentum

  // The elementwise ops of a run are multi-tensor (_foreach_*) ops: a few launches on
  // CUDA instead of several per parameter; per tensor they compute exactly what PyTorch's
  // per-parameter lerp_/lerp/mul_ do (on the CPU they are those calls).
  for (const auto& [begin, end] : runs) {
    std::vector<torch::Tensor> run, run_grads, bufs;
    for (size_t i = begin; i < end; ++i) {
      const at::Tensor& p = params[order[i]];
      run.push_back(p);
      run_grads.push_back(grads[order[i]]);
      bufs.push_back(
          static_cast<MuonParamState&>(*state_.at(p.unsafeGetTensorImpl())).momentum_buffer());
      if (ok.defined()) {
        for (const auto& t : {p, bufs.back()}) saved.emplace_back(t, t.clone());
      }
    }
    const int64_t rows = run.front().size(0),
                  cols = run.front().numel() / std::max<int64_t>(rows, 1);
    const auto count = static_cast<int64_t>(run.size());
    at::_foreach_lerp_(bufs, run_grads, 1.0 - momentum);
    const std::vector<torch::Tensor> nesterov =
        options.nesterov() ? at::_foreach_lerp(run_grads, bufs, momentum) : bufs;
    // Sharded: Newton–Schulz and the update of the owned parameters only (per parameter the
    // same arithmetic); the momenta above are every parameter's.
    std::vector<torch::Tensor> mine, input;
    for (int64_t k = 0; k < count; ++k) {
      if (!sharded || shard_.owns(run[k])) {
        mine.push_back(run[k]);
        input.push_back(nesterov[k]);
      }
    }
    if (mine.empty()) continue;
    torch::Tensor updates =
        at::empty({static_cast<int64_t>(mine.size()), rows, cols},
                  at::TensorOptions().dtype(ns.compute_dtype).device(run.front().device()));
    for (size_t k = 0; k < input.size(); ++k) {  // cast to the compute dtype in the copy
      updates[static_cast<int64_t>(k)].view(input[k].sizes()).copy_(input[k]);
    }
    const torch::Tensor ortho =
        mine.size() == 1 ? newton_schulz(updates[0], ns).unsqueeze(0) : newton_schulz(updates, ns);
    for (size_t k = 0; k < mine.size(); ++k)
      updates_of.push_back({mine[k], ortho[static_cast<int64_t>(k)]});
  }
  // Every run's update in one call: on CUDA one multi-tensor kernel per dtype pair (the
  // learning rate read on the device in a graph), elsewhere torch.optim.Muon's ops.
  ops::muon_update(updates_of, {lr, options.weight_decay(), options.adjust_lr(), device_lr});
  for (const auto& [tensor, before] : saved) {
    tensor.copy_(at::where(ok.to(tensor.device()), tensor, before));
  }
}

void Muon::graph_group(size_t g, const std::vector<at::Tensor>& params,
                       const std::vector<at::Tensor>& grads, const at::Tensor& ok) {
  const auto& o = static_cast<const MuonOptions&>(param_groups_[g].options());
  auto& graph = graphs_->of(g);
  // What the stages touch besides the static inputs: the parameters and their momentum buffers.
  std::vector<int64_t> layout = graph.layout(o);
  for (const at::Tensor& p : params) {
    detail::GraphedStep::describe(layout, p);
    detail::GraphedStep::describe(
        layout,
        static_cast<const MuonParamState&>(*state_.at(p.unsafeGetTensorImpl())).momentum_buffer());
  }
  const bool ran = graph.step.run(
      std::move(layout), grads, {ok}, o.lr(), params.front().device(),
      [&](const detail::GraphedStep::Inputs& s) {
        step_group(g, params, s.grads, s.tensors[0], s.lr);
      },
      "Muon: param group " + std::to_string(g));
  if (!ran) step_group(g, params, grads, ok, {});  // the capture failed; nothing ran
}

Muon::GraphStats Muon::graph_stats(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "Muon::graph_stats: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  const auto it = graphs_->groups.find(group);
  if (it == graphs_->groups.end()) return {};
  return {it->second.step.captures(), it->second.step.replays()};
}

void Muon::set_step_shard(StepShard shard) {
  shard.enabled("Muon::set_step_shard");
  shard_ = std::move(shard);
}

namespace {

constexpr const char* kMuonChecksum = "muon/checksum";

// Every group's options and every parameter's momentum buffer, in group order: what a checkpoint
// stores and load() recomputes from what it read.
uint64_t state_checksum(const Muon& muon) {
  detail::Checksum sum;
  for (const auto& group : muon.param_groups()) {
    static_cast<const MuonOptions&>(group.options()).add_to_checksum(sum);
    for (const auto& p : group.params()) {
      const auto it = muon.state().find(p.unsafeGetTensorImpl());
      if (it == muon.state().end()) {
        sum.add(int64_t{0});
      } else {
        sum.add(int64_t{1}).add(static_cast<const MuonParamState&>(*it->second).momentum_buffer());
      }
    }
  }
  return sum.value();
}

}  // namespace

void Muon::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
  detail::write_checksum(archive, kMuonChecksum, state_checksum(*this));
}

void Muon::load(torch::serialize::InputArchive& archive) {
  detail::load_transactional(
      *this,
      [&] {
        c10::IValue value;
        TORCH_CHECK(!archive.try_read("fogo/format", value),
                    "Muon::load: not a Muon checkpoint (FOGO wrote it; load it with FOGO::load)");
        // LibTorch's reader throws torch::jit errors or internal asserts, naming no optimizer,
        // for an archive that is not a Muon checkpoint (a module's, AdamW's) or a damaged one.
        try {
          serialize(*this, archive);
        } catch (const std::exception& e) {
          const std::string what = e.what();
          TORCH_CHECK(false, "Muon::load: not a Muon checkpoint (or a damaged one): ",
                      what.substr(0, what.find('\n')));
        }
        detail::verify_checksum(archive, "Muon", kMuonChecksum, state_checksum(*this));
      },
      [&](size_t g, size_t i, const torch::Tensor& p) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) return;
        auto& st = static_cast<MuonParamState&>(*it->second);
        const auto& buf = st.momentum_buffer();
        TORCH_CHECK(buf.defined() && buf.sizes() == p.sizes(),
                    "Muon::load: the checkpoint's momentum_buffer for ",
                    detail::describe_param(g, i, p), " has shape ",
                    buf.defined() ? buf.sizes() : at::IntArrayRef{},
                    "; the checkpoint was made for a different model");
        detail::check_finite_state("Muon", "momentum_buffer for " + detail::describe_param(g, i, p),
                                   buf);
        static_cast<const MuonOptions&>(param_groups_[g].options()).validate();
        st.momentum_buffer(buf.to(p.device()));  // archives load onto the CPU
      });
}

}  // namespace fogo

// Google Benchmark (part of fogo_bench): a step row for each path bench_step.cpp's rows do not
// take (issue 44: so that a regression shows without a GPU), over the same model sets
// (model_sets.h), each comparable with its bench_step.cpp row of the same arguments:
//   BM_Path_{Muon,FOGO}Stack   the set's matrices stacked by shape, [E, out, in...] with
//                              batch_dims 1 (a stack of experts): the same matrices as
//                              BM_Step_{Muon,FOGO}
//   BM_Path_{Muon,FOGO}Blocks  every matrix's rows in 3 unequal blocks (rows/2, rows/4, rows/4:
//                              a fused GQA projection), `blocks` per group (one group per row
//                              count)
//   BM_Path_{Muon,FOGO}Owner   rank 0's share of an owner-computes step of a world of 1, 2 or 4
//                              (the third argument), in one process: the StepShard fogo::dist's
//                              shard_step installs, with the owners it computes, the broadcast
//                              replaced by nothing (see owner_shard)
//   BM_Path_FusedAdamW         fogo::FusedAdamW on the set's matrices: BM_Step_AdamW's
//                              torch::optim::AdamW on the same tensors
//
//   fogo_bench --benchmark_filter='Path|Step_(Muon|FOGO|AdamW)/1/0/1' --benchmark_min_time=0.01
// Args: set (0 GPT-2, 1 ResNet-18), device (0 CPU, 1 CUDA), NS dtype (0 bf16, 1 fp32, 2 auto);
// the Owner rows: set, device, world (NS in fp32).
#include <benchmark/benchmark.h>
#include <fogo/fogo.h>
#include <fogo/matrix_view.h>
#include <fogo/step_shard.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "model_sets.h"

namespace {

using fogo::bench::fogo_preset;
using fogo::bench::make_params;
using fogo::bench::model_shapes;
using fogo::bench::setup;
using fogo::bench::Setup;
using fogo::bench::Shape;
using fogo::bench::time_steps;
using Groups = std::vector<torch::optim::OptimizerParamGroup>;

// The set's matrices stacked by shape (in order of first appearance), each stack with a gradient.
std::vector<torch::Tensor> make_stacks(int64_t set, const torch::Device& device) {
  std::map<Shape, std::vector<torch::Tensor>> by_shape;
  std::vector<Shape> order;
  for (const auto& p : make_params(set, device)) {
    const Shape shape = p.sizes().vec();
    if (by_shape[shape].empty()) order.push_back(shape);
    by_shape[shape].push_back(p);
  }
  std::vector<torch::Tensor> stacks;
  for (const Shape& shape : order) {
    std::vector<torch::Tensor> values, grads;
    for (const auto& p : by_shape[shape]) {
      values.push_back(p.detach());
      grads.push_back(p.grad());
    }
    auto stack = torch::stack(values).requires_grad_(true);
    stack.mutable_grad() = torch::stack(grads);
    stacks.push_back(stack);
  }
  return stacks;
}

// One group per row count, each with its blocks (rows - 2 (rows / 4), rows / 4, rows / 4).
template <class Options>
Groups block_groups(const std::vector<torch::Tensor>& params, const Options& base) {
  std::map<int64_t, std::vector<torch::Tensor>> by_rows;
  for (const auto& p : params) by_rows[p.size(0)].push_back(p);
  Groups groups;
  for (const auto& [rows, ps] : by_rows) {
    auto o = std::make_unique<Options>(base);
    o->blocks({rows - 2 * (rows / 4), rows / 4, rows / 4});
    groups.emplace_back(ps, std::move(o));
  }
  return groups;
}

using Make = std::function<std::unique_ptr<fogo::MatrixOptimizer>(std::vector<torch::Tensor>,
                                                                  int64_t set, torch::ScalarType)>;

void step_row(benchmark::State& state, bool stacked, const Make& make) {
  const Setup s = setup(state);
  if (!s.ok) return;
  const int64_t set = state.range(0);
  auto params = stacked ? make_stacks(set, s.device) : make_params(set, s.device);
  auto opt = make(params, set, s.ns_dtype);
  time_steps(state, s.device, 2, [&] { opt->step(); });
}

void BM_Path_MuonStack(benchmark::State& state) {
  step_row(state, true, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt).batch_dims(1));
  });
}
void BM_Path_FOGOStack(benchmark::State& state) {
  step_row(state, true, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt).batch_dims(1));
  });
}
void BM_Path_MuonBlocks(benchmark::State& state) {
  step_row(state, false, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    const auto o = fogo::MuonOptions(0.02).ns_dtype(dt);
    return fogo::with_param_groups<fogo::Muon>(block_groups(p, o), o);
  });
}
void BM_Path_FOGOBlocks(benchmark::State& state) {
  step_row(state, false, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    const auto o = fogo_preset(set, dt);
    return fogo::with_param_groups<fogo::FOGO>(block_groups(p, o), o);
  });
}

// Rank 0's StepShard in a world of `world`: every matrix of every parameter's matrix view a unit
// at fogo::newton_schulz_cost of its shape, owners by fogo::assign_owners, as
// fogo::dist::shard_step computes them. There the exchange broadcasts each unit's values from
// its owner; here it leaves a unit rank 0 does not own as it is, its parameter untouched, and
// zeroes the buffers the step made to receive it (FOGO's projections), so that the row times rank
// 0's share of the work without the communication.
fogo::StepShard owner_shard(const fogo::MatrixOptimizer& opt, int64_t world) {
  using Unit = std::pair<const c10::TensorImpl*, int64_t>;
  std::vector<Unit> units;
  std::vector<double> costs;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    for (const auto& p : opt.param_groups()[g].params()) {
      const fogo::MatrixView view = opt.matrix_view(g, p);
      for (int64_t k = 0; k < view.count(); ++k) {
        units.emplace_back(p.unsafeGetTensorImpl(), k);
        costs.push_back(fogo::newton_schulz_cost(fogo::matrix_of(p, view, k).sizes()));
      }
    }
  }
  const std::vector<int64_t> owners = fogo::assign_owners(costs, world);
  auto mine = std::make_shared<std::set<Unit>>();
  for (size_t i = 0; i < units.size(); ++i)
    if (owners[i] == 0) mine->insert(units[i]);
  fogo::StepShard shard;
  shard.owns = [mine](const torch::Tensor& p, int64_t k) {
    return mine->count({p.unsafeGetTensorImpl(), k}) > 0;
  };
  shard.exchange = [mine](const std::vector<fogo::ShardUnit>& us,
                          const std::vector<std::vector<torch::Tensor>>& values) {
    for (size_t i = 0; i < us.size(); ++i) {
      if (mine->count({us[i].param.unsafeGetTensorImpl(), us[i].matrix})) continue;
      for (const auto& t : values[i])
        if (!t.is_alias_of(us[i].param)) t.zero_();
    }
  };
  return shard;
}

void owner_row(benchmark::State& state, const Make& make) {
  const int64_t set = state.range(0), world = state.range(3);
  const Setup s = setup(state, ", world " + std::to_string(world) + " rank 0");
  if (!s.ok) return;
  auto opt = make(make_params(set, s.device), set, s.ns_dtype);
  opt->set_step_shard(owner_shard(*opt, world));
  time_steps(state, s.device, 2, [&] { opt->step(); });
  // The zeroed receive buffers must leave a step that computes numbers (no NaN from them).
  for (const auto& g : opt->param_groups())
    for (const auto& p : g.params())
      if (!torch::isfinite(p).all().item<bool>())
        return state.SkipWithError("non-finite parameters after the stand-in exchange");
}

void BM_Path_MuonOwner(benchmark::State& state) {
  owner_row(state, [](std::vector<torch::Tensor> p, int64_t, torch::ScalarType dt) {
    return std::make_unique<fogo::Muon>(p, fogo::MuonOptions(0.02).ns_dtype(dt));
  });
}
void BM_Path_FOGOOwner(benchmark::State& state) {
  owner_row(state, [](std::vector<torch::Tensor> p, int64_t set, torch::ScalarType dt) {
    return std::make_unique<fogo::FOGO>(p, fogo_preset(set, dt));
  });
}

void BM_Path_FusedAdamW(benchmark::State& state) {  // the NS dtype argument is ignored
  const Setup s = setup(state);
  if (!s.ok) return;
  auto params = make_params(state.range(0), s.device);
  fogo::FusedAdamW opt(params, torch::optim::AdamWOptions(1e-3));
  time_steps(state, s.device, 2, [&] { opt.step(); });
}

void path_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1}) b->Args({set, device, dtype});
}
void owner_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1})
      for (int64_t dtype : {0, 1})
        for (int64_t world : {1, 2, 4}) b->Args({set, device, dtype, world});
}
void adamw_args(benchmark::internal::Benchmark* b) {
  for (int64_t device : {0, 1})
    for (int64_t set : {0, 1}) b->Args({set, device, 0});
}

}  // namespace

BENCHMARK(BM_Path_MuonStack)->Apply(path_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_FOGOStack)->Apply(path_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_MuonBlocks)->Apply(path_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_FOGOBlocks)->Apply(path_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_MuonOwner)->Apply(owner_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_FOGOOwner)->Apply(owner_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Path_FusedAdamW)->Apply(adamw_args)->Unit(benchmark::kMillisecond)->UseRealTime();

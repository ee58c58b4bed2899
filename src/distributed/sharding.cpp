// fogo::dist's sharded steps (dist/sharding.h): ShardedOptimizer (state sharded) and
// shard_step (FOGO's, Muon's and a hybrid's matrix side's expensive work on an owner rank).
#include <fogo/hybrid.h>
#include <fogo/matrix_optimizer.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "fogo_private/distributed/internal.h"

namespace fogo::dist {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// Sharded optimizer mode

double newton_schulz_cost(const torch::Tensor& param) {
  return fogo::newton_schulz_cost(param.sizes());
}

namespace {

/// fogo::assign_owners by `cost` (step_shard.h).
std::vector<int64_t> assign_owners(const std::vector<at::Tensor>& params, int64_t world,
                                   const ShardedOptimizer::Cost& cost) {
  std::vector<double> costs;
  for (const auto& p : params) costs.push_back(cost(p));
  return fogo::assign_owners(costs, world);
}

/// Overwrites every rank's tensors[i] with owners[i]'s: per owner, one flat broadcast per device
/// and dtype.
void broadcast_from_owners(ProcessGroup::Impl& s, const std::vector<at::Tensor>& tensors,
                           const std::vector<int64_t>& owners, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (int64_t owner = 0; owner < s.launch.world_size; ++owner) {
    std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> groups;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (owners[i] == owner) {
        groups[{tensors[i].device().str(), tensors[i].scalar_type()}].push_back(tensors[i]);
      }
    }
    for (auto& [key, members] : groups) {
      std::vector<at::Tensor> flat_views;
      for (const auto& t : members) {
        flat_views.push_back(t.detach().reshape({-1}));
      }
      std::vector<at::Tensor> flat{torch::cat(flat_views)};
      c10d::BroadcastOptions o;
      o.rootRank = owner;
      TORCH_CHECK(s.pg, "fogo::dist: the process group was shut down");
      s.wait(s.pg->broadcast(flat, o), what + ": broadcast from rank " + std::to_string(owner));
      if (owner == s.launch.rank) {
        continue;
      }
      int64_t offset = 0;
      for (const auto& t : members) {
        t.detach().copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  }
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(ProcessGroup group, std::vector<torch::Tensor> params,
                                   Factory make, const Cost& cost)
    : group_(std::move(group)), params_(std::move(params)), make_(std::move(make)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].defined(), "fogo::dist::ShardedOptimizer: parameter ", i,
                " is undefined");
  }
  TORCH_CHECK(make_, "fogo::dist::ShardedOptimizer: no factory");
  check_same_layout(impl(group_), numbered("parameter", params_), "ShardedOptimizer");
  owners_ = assign_owners(params_, group_.world_size(), cost);
  const auto owned = owned_by(group_.rank());
  if (!owned.empty()) {
    local_ = make_(owned);
    TORCH_CHECK(local_, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  }
}

std::vector<torch::Tensor> ShardedOptimizer::owned_by(int64_t rank) const {
  std::vector<torch::Tensor> owned;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] == rank) {
      owned.push_back(params_[i]);
    }
  }
  return owned;
}

void ShardedOptimizer::step() {
  if (local_) {
    local_->step();
  }
  broadcast_from_owners(impl(group_), params_, owners_, "ShardedOptimizer::step");
}

namespace {

/// Moves the state of `params` from `from` to `to` and copies `from`'s param-group options into
/// `to` (group by group: the factory makes one layout).
void move_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to,
                const std::vector<torch::Tensor>& params, const std::string& what) {
  TORCH_CHECK(from.param_groups().size() == to.param_groups().size(), "fogo::dist::", what,
              ": the factory made ", from.param_groups().size(), " and ", to.param_groups().size(),
              " param groups for two sets of parameters; it must make one layout");
  for (size_t g = 0; g < to.param_groups().size(); ++g) {
    to.param_groups()[g].set_options(from.param_groups()[g].options().clone());
  }
  for (const auto& p : params) {
    auto it = from.state().find(p.unsafeGetTensorImpl());
    if (it != from.state().end()) {
      to.state()[p.unsafeGetTensorImpl()] = std::move(it->second);
      from.state().erase(it);
    }
  }
}

}  // namespace

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  std::string blob;
  if (local_) {
    torch::serialize::OutputArchive mine;
    local_->save(mine);
    std::ostringstream out;
    mine.save_to(out);
    blob = out.str();
  }
  const auto blobs = all_gather_bytes(impl(group_), blob, "ShardedOptimizer::save");
  auto whole = make_(params_);
  TORCH_CHECK(whole, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  // From the highest rank down, so that the options that stay are the lowest owner's (every
  // rank's are the same when the training loop sets them alike).
  for (int64_t r = group_.world_size() - 1; r >= 0; --r) {
    const auto owned = owned_by(r);
    if (owned.empty()) {
      continue;
    }
    auto shard = make_(owned);
    torch::serialize::InputArchive in;
    std::istringstream bytes(blobs[r]);
    in.load_from(bytes);
    shard->load(in);
    move_state(*shard, *whole, owned, "ShardedOptimizer::save");
  }
  whole->save(archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  auto whole = make_(params_);
  TORCH_CHECK(whole, "fogo::dist::ShardedOptimizer: the factory returned no optimizer");
  whole->load(archive);  // throws before anything here changes
  const auto owned = owned_by(group_.rank());
  std::unique_ptr<torch::optim::Optimizer> local;
  if (!owned.empty()) {
    local = make_(owned);
    move_state(*whole, *local, owned, "ShardedOptimizer::load");
  }
  local_ = std::move(local);
}

std::vector<int64_t> shard_step(const ProcessGroup& group, torch::optim::Optimizer& optimizer,
                                const ShardedOptimizer::Cost& cost) {
  if (auto* hybrid = dynamic_cast<fogo::HybridOptimizer*>(&optimizer)) {
    TORCH_CHECK(hybrid->matrix(), "fogo::dist::shard_step: the hybrid has no matrix side");
    return shard_step(group, *hybrid->matrix(), cost);
  }
  auto* matrix = dynamic_cast<fogo::MatrixOptimizer*>(&optimizer);
  TORCH_CHECK(matrix, "fogo::dist::shard_step shards fogo::FOGO, fogo::Muon or a ",
              "HybridOptimizer's matrix side, not a ", c10::demangle(typeid(optimizer).name()),
              "; other optimizers shard with ShardedOptimizer");
  std::vector<at::Tensor> params;
  std::vector<std::pair<size_t, at::Tensor>> grouped;  // (group, parameter)
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (const auto& p : optimizer.param_groups()[g].params()) {
      params.push_back(p);
      grouped.emplace_back(g, p);
    }
  }
  check_same_layout(impl(group), numbered("parameter", params), "shard_step");
  // The units of work: each matrix of each parameter's matrix view (the experts of a stack, the
  // blocks of a fused weight), each at `cost` of its view (newton_schulz_cost: its own
  // [rows, cols]).
  std::vector<std::pair<const c10::TensorImpl*, int64_t>> units;
  std::vector<double> costs;
  for (const auto& [g, p] : grouped) {
    const fogo::MatrixView view = matrix->matrix_view(g, p);
    for (int64_t k = 0; k < view.count(); ++k) {
      units.emplace_back(p.unsafeGetTensorImpl(), k);
      costs.push_back(cost(fogo::matrix_of(p, view, k)));
    }
  }
  const auto owners = fogo::assign_owners(costs, group.world_size());
  auto owner_of = std::make_shared<std::map<std::pair<const c10::TensorImpl*, int64_t>, int64_t>>();
  for (size_t i = 0; i < units.size(); ++i) (*owner_of)[units[i]] = owners[i];
  const auto find = [owner_of](const at::Tensor& p, int64_t k) {
    const auto it = owner_of->find({p.unsafeGetTensorImpl(), k});
    TORCH_CHECK(it != owner_of->end(), "fogo::dist::shard_step: matrix ", k,
                " of a parameter of the step (shape ", p.sizes(),
                ") was not in the optimizer when it was sharded; call shard_step again after ",
                "add_param_group or a change of batch_dims, heads or blocks");
    return it->second;
  };
  fogo::StepShard shard;
  const auto rank = group.rank();
  shard.owns = [find, rank](const torch::Tensor& p, int64_t k) { return find(p, k) == rank; };
  shard.exchange = [find, group](const std::vector<fogo::ShardUnit>& us,
                                 const std::vector<std::vector<torch::Tensor>>& values) {
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> owners;
    for (size_t i = 0; i < us.size(); ++i) {
      const auto owner = find(us[i].param, us[i].matrix);
      for (const auto& t : values[i]) {
        tensors.push_back(t);
        owners.push_back(owner);
      }
    }
    broadcast_from_owners(impl(group), tensors, owners, "shard_step exchange");
  };
  matrix->set_step_shard(std::move(shard));
  return owners;
}

void ShardedOptimizer::zero_grad() {
  for (auto& p : params_) {
    p.mutable_grad() = torch::Tensor();
  }
}

}  // namespace fogo::dist

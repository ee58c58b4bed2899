// fogo::dist's GradientAverager (dist/gradients.h): bucketed all-reduce of gradients as backward
// produces them.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include "fogo_private/distributed/internal.h"

namespace fogo::dist {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// GradientAverager

struct GradientAverager::State {
  struct Bucket {
    std::vector<size_t> members;   // indices into params
    std::vector<int64_t> offsets;  // of each member in flat
    at::Tensor flat;
    size_t waiting = 0;  // members whose gradient this backward has not produced yet
    c10::intrusive_ptr<c10d::Work> work;
  };

  ProcessGroup group;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;  // in errors
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<uint8_t> ready;
  size_t next_launch = 0;  // buckets go out in order: every rank issues the same collectives
  bool sync = true;
  std::mutex mutex;
  // The accumulator's owning pointer: std::shared_ptr<Node> in torch 2.11, c10::intrusive_ptr<Node>
  // in 2.15 (Node became an intrusive-pointer target); held so the hook can be removed.
  using AccumulatorPtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>()));
  std::vector<std::pair<AccumulatorPtr, uintptr_t>> hooks;

  State(ProcessGroup g, const NamedTensors& all, int64_t bucket_bytes);
  ~State() {
    for (auto& [node, key] : hooks) {
      node->del_post_hook(key);
    }
  }

  /// From the hook on parameter i's gradient accumulator, once backward has accumulated it.
  void mark_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) {
      return;
    }
    TORCH_CHECK(!ready[i], "fogo::dist::GradientAverager: the gradient of ", names[i],
                " was accumulated twice since the last finish(): accumulate inside no_sync(), ",
                "or call finish() after each backward");
    ready[i] = 1;
    if (--buckets[bucket_of[i]].waiting == 0) {
      while (next_launch < buckets.size() && buckets[next_launch].waiting == 0) {
        launch(next_launch++);
      }
    }
  }

  /// Copies bucket k's gradients (zeros where a parameter has none) into its buffer and starts
  /// the all-reduce.
  void launch(size_t k) {
    auto& b = buckets[k];
    {
      torch::NoGradGuard no_grad;
      for (size_t j = 0; j < b.members.size(); ++j) {
        const auto& p = params[b.members[j]];
        auto slice = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
        const auto& grad = p.grad();
        if (grad.defined()) {
          TORCH_CHECK(!grad.is_sparse(), "fogo::dist::GradientAverager: ", names[b.members[j]],
                      " has a sparse gradient, which is not supported");
          slice.copy_(grad);
        } else {
          slice.zero_();
        }
      }
    }
    std::vector<at::Tensor> tensors{b.flat};
    b.work = group.c10d().allreduce(tensors);
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), 0);
    for (auto& b : buckets) {
      b.waiting = b.members.size();
      b.work.reset();
    }
    next_launch = 0;
  }

  void finish();
};

namespace {

struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(GradientAverager::State* s, size_t i) : state(s), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    state->mark_ready(index);
    return outputs;
  }
  GradientAverager::State* state;
  size_t index;
};

}  // namespace

GradientAverager::State::State(ProcessGroup g, const NamedTensors& all, int64_t bucket_bytes)
    : group(std::move(g)) {
  TORCH_CHECK(bucket_bytes > 0, "fogo::dist::GradientAverager: bucket_bytes must be positive");
  NamedTensors named;
  for (const auto& [name, p] : all) {
    TORCH_CHECK(p.defined(), "fogo::dist::GradientAverager: ", name, " is undefined");
    if (!p.requires_grad()) {
      continue;
    }
    TORCH_CHECK(p.is_leaf(), "fogo::dist::GradientAverager: ", name, " is not a leaf tensor");
    for (size_t j = 0; j < params.size(); ++j) {
      TORCH_CHECK(!params[j].is_same(p), "fogo::dist::GradientAverager: ", name, " and ", names[j],
                  " are the same tensor");
    }
    params.push_back(p);
    names.push_back(name);
    named.emplace_back(name, p);
  }
  check_same_layout(impl(group), named, "GradientAverager");

  // Reverse order, one open bucket per (device, dtype): backward tends to produce gradients from
  // the last parameters to the first, so buckets fill (and go out) early.
  std::map<std::pair<std::string, c10::ScalarType>, size_t> open;
  std::vector<int64_t> filled;
  bucket_of.resize(params.size());
  for (size_t i = params.size(); i-- > 0;) {
    const auto& p = params[i];
    const std::pair key{p.device().str(), p.scalar_type()};
    auto it = open.find(key);
    if (it == open.end()) {
      it = open.emplace(key, buckets.size()).first;
      buckets.emplace_back();
      filled.push_back(0);
    }
    const auto k = it->second;
    buckets[k].members.push_back(i);
    buckets[k].offsets.push_back(filled[k] / static_cast<int64_t>(p.element_size()));
    filled[k] += p.numel() * static_cast<int64_t>(p.element_size());
    bucket_of[i] = k;
    if (filled[k] >= bucket_bytes) {
      open.erase(it);
    }
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto& first = params[buckets[k].members[0]];
    buckets[k].flat = torch::empty({filled[k] / static_cast<int64_t>(first.element_size())},
                                   first.options().requires_grad(false));
  }
  ready.assign(params.size(), 0);
  reset();
  for (size_t i = 0; i < params.size(); ++i) {
    auto node = torch::autograd::impl::grad_accumulator(params[i]);
    const auto key = node->add_post_hook(std::make_unique<ReadyHook>(this, i));
    hooks.emplace_back(std::move(node), key);
  }
}

void GradientAverager::State::finish() {
  std::lock_guard<std::mutex> lock(mutex);
  TORCH_CHECK(sync, "fogo::dist::GradientAverager::finish() inside a no_sync() scope");
  auto& s = impl(group);
  const auto world = s.launch.world_size;
  at::Tensor counts;
  try {
    // Buckets backward did not complete hold parameters without a gradient on this rank.
    while (next_launch < buckets.size()) {
      launch(next_launch++);
    }
    auto used = torch::empty({static_cast<int64_t>(params.size())}, torch::kInt32);
    for (size_t i = 0; i < params.size(); ++i) {
      used[static_cast<int64_t>(i)] = static_cast<int32_t>(params[i].grad().defined());
    }
    std::vector<at::Tensor> used_tensors{used.to(s.control_device)};
    const auto used_work = group.c10d().allreduce(used_tensors);
    for (size_t k = 0; k < buckets.size(); ++k) {
      s.wait(buckets[k].work, "all-reduce of gradient bucket " + std::to_string(k) + " (of " +
                                  std::to_string(buckets.size()) + ")");
    }
    s.wait(used_work, "all-reduce of the gradient counts");
    counts = used_tensors[0].cpu();
  } catch (...) {
    reset();
    throw;
  }
  const auto count = counts.accessor<int32_t, 1>();
  torch::NoGradGuard no_grad;
  for (auto& b : buckets) {
    b.flat.div_(world);
    for (size_t j = 0; j < b.members.size(); ++j) {
      const auto i = b.members[j];
      if (count[static_cast<int64_t>(i)] == 0) {
        continue;  // no rank has a gradient: it stays undefined
      }
      auto& p = params[i];
      const auto average = b.flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
      auto& grad = p.mutable_grad();
      if (grad.defined()) {
        grad.copy_(average);
      } else {
        grad = torch::empty_like(p, at::MemoryFormat::Preserve).copy_(average);
      }
    }
  }
  reset();
}

GradientAverager::GradientAverager(ProcessGroup group, const std::vector<torch::Tensor>& params,
                                   GradientAveragerOptions options)
    : state_(std::make_unique<State>(std::move(group), numbered("parameter", params),
                                     options.bucket_bytes())) {}
GradientAverager::GradientAverager(ProcessGroup group, const torch::nn::Module& module,
                                   GradientAveragerOptions options) {
  NamedTensors named;
  for (const auto& item : module.named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  state_ = std::make_unique<State>(std::move(group), named, options.bucket_bytes());
}
GradientAverager::~GradientAverager() = default;
GradientAverager::GradientAverager(GradientAverager&&) noexcept = default;
GradientAverager& GradientAverager::operator=(GradientAverager&&) noexcept = default;

void GradientAverager::finish() { state_->finish(); }

GradientAverager::NoSync GradientAverager::no_sync() { return NoSync(*this); }

GradientAverager::NoSync::NoSync(GradientAverager& averager) : averager_(averager) {
  auto& s = *averager_.state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  previous_ = s.sync;
  s.sync = false;
}

GradientAverager::NoSync::~NoSync() {
  auto& s = *averager_.state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sync = previous_;
}

size_t GradientAverager::buckets_started() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_launch;
}

std::vector<std::vector<size_t>> GradientAverager::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) {
    out.push_back(b.members);
  }
  return out;
}

}  // namespace fogo::dist

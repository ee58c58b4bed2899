// A third matrix optimizer on fogo's frame (matrix_optimizer.h: MatrixOptimizerOf), written as a
// new optimizer would be: its options, its state, and its device step. Orthogonalized SGD with
// momentum and decoupled weight decay,
//   buf <- mu buf + G,   p <- p (1 - lr wd) - lr NS(buf)
// (mu = 0: plain orthogonalized SGD). Everything else comes from the frame, and is tested here:
// the step against an independent computation (fogo::newton_schulz), checkpoints (the frame's
// generic tensor-state format: a round trip continues bit for bit), NonFinitePolicy::Mask (a NaN
// gradient leaves every bit), sharding (two ranks in one process, bit for bit the unsharded step)
// and CUDA graphs (a GPU test: skipped without one). It includes fogo's public headers only, as an
// optimizer written outside fogo would: fogo/device_step.h (StepInputs, LearningRate) and
// fogo/tensor_states.h come with fogo/fogo.h.
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace {

using fogo::NonFinitePolicy;
using fogo::test::bit_identical;

// Its options are also fogo::MatrixOptions (matrix_options.h), which is how the routing table
// (fogo::update_scale, fogo::treated_as) reads their layout and scale.
struct OrthoSGDOptions : torch::optim::OptimizerCloneableOptions<OrthoSGDOptions>,
                         fogo::MatrixOptions {
  explicit OrthoSGDOptions(double lr = 0.02) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, weight_decay) = 0.1;
  TORCH_ARG(NonFinitePolicy, nonfinite) = NonFinitePolicy::Raise;
  TORCH_ARG(bool, cuda_graph) = false;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  // One matrix per parameter; the update lr NS(buf), an orthogonal [rows, cols] matrix's RMS
  // 1 / sqrt(max(rows, cols)) per entry times lr.
  fogo::MatrixLayout layout() const override { return {}; }
  fogo::UpdateScale update_scale(const std::vector<int64_t>& sizes) const override {
    const int64_t rows = sizes.at(0);
    const int64_t cols = c10::multiply_integers(sizes) / rows;
    const double rms = 1.0 / std::sqrt(static_cast<double>(std::max(rows, cols)));
    return {lr(), rms, "orthogonalized SGD, RMS ~ " + std::to_string(rms) + " lr"};
  }
  void validate() const {
    TORCH_CHECK(lr() >= 0 && momentum() >= 0 && momentum() < 1 && weight_decay() >= 0,
                "OrthoSGD: lr, momentum in [0, 1) and weight_decay must be non-negative");
  }
  friend bool operator==(const OrthoSGDOptions& a, const OrthoSGDOptions& b) {
    return a.lr() == b.lr() && a.momentum() == b.momentum() &&
           a.weight_decay() == b.weight_decay() && a.nonfinite() == b.nonfinite() &&
           a.cuda_graph() == b.cuda_graph();
  }
};

struct OrthoSGDState : torch::optim::OptimizerCloneableParamState<OrthoSGDState> {
  TORCH_ARG(torch::Tensor, buf);
};

// The optimizer: its state, the tensors its step touches, its device step, its checkpoint's
// state names. Nothing else.
class OrthoSGD : public fogo::MatrixOptimizerOf<OrthoSGDOptions> {
 public:
  OrthoSGD(std::vector<torch::Tensor> params, const OrthoSGDOptions& o)
      : MatrixOptimizerOf({torch::optim::OptimizerParamGroup(std::move(params))}, o) {}

  void save(torch::serialize::OutputArchive& archive) const override {
    fogo::save_tensor_states(*this, archive, "ortho_sgd", states());
  }
  void load(torch::serialize::InputArchive& archive) override {
    fogo::load_tensor_states(
        *this, archive, "ortho_sgd", states(), [](const std::string&) { return true; }, "OrthoSGD");
  }

 private:
  const char* name() const override { return "OrthoSGD"; }
  at::Tensor& buf(const at::Tensor& p) const {
    return static_cast<OrthoSGDState&>(*state_.at(p.unsafeGetTensorImpl())).buf();
  }
  void create_state(const GroupStep& s) override {
    for (const at::Tensor& p : s.params) {
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) slot = std::make_unique<OrthoSGDState>(OrthoSGDState().buf(torch::zeros_like(p)));
    }
  }
  // What the step touches: a graph is captured again when one changes, and a masked step (the
  // frame's default masked_tensors) puts them back where the flag is false.
  std::vector<at::Tensor> touched(const GroupStep& s) const override {
    std::vector<at::Tensor> out = s.params;
    for (const at::Tensor& p : s.params) out.push_back(buf(p));
    return out;
  }
  void device_step(const fogo::StepInputs& in) override {
    const auto& o = options(in.group);
    for (size_t k = 0; k < in.params.size(); ++k) {
      const at::Tensor& p = in.params[k];
      buf(p).mul_(o.momentum()).add_(in.grads[k]);
      if (!owns(p, 0)) continue;  // sharded: its owner's (the frame exchanges it)
      const at::Tensor O = fogo::newton_schulz(buf(p)).to(p.scalar_type());
      if (in.lr.on_device()) {  // a CUDA graph's learning rate
        p.mul_(in.lr.decay_on_device(o.weight_decay()).to(p.scalar_type()))
            .sub_(O * in.lr.scaled_on_device(1.0).to(p.scalar_type()));
      } else {
        p.mul_(in.lr.decay(o.weight_decay())).add_(O, -in.lr.scaled(1.0));
      }
    }
  }
  static fogo::TensorStates states() {
    return {{"buf"},
            [](const torch::optim::OptimizerParamState& s) {
              return fogo::TensorStates::Named{{"buf", static_cast<const OrthoSGDState&>(s).buf()}};
            },
            [](const fogo::TensorStates::Named& named) {
              return std::make_unique<OrthoSGDState>(OrthoSGDState().buf(named.at(0).second));
            }};
  }
};

std::vector<torch::Tensor> make_params(torch::Device device = torch::kCPU) {
  torch::manual_seed(31);
  return {torch::randn({6, 10}, device).requires_grad_(true),
          torch::randn({12, 5}, device).requires_grad_(true)};
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

void feed(std::vector<torch::Tensor>& params, int64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes(), p.options());
}

std::vector<torch::Tensor> values(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST(ThirdOptimizer, StepsAsAnIndependentComputationOfOrthogonalizedSGD) {
  auto params = make_params();
  const OrthoSGDOptions o;
  OrthoSGD opt(params, o);
  std::vector<torch::Tensor> want = values(params), bufs;
  for (const auto& p : params) bufs.push_back(torch::zeros_like(p));
  for (int64_t step = 0; step < 3; ++step) {
    feed(params, 100 + step);
    opt.step();
    for (size_t k = 0; k < params.size(); ++k) {
      bufs[k] = bufs[k] * o.momentum() + params[k].grad();
      const auto O = fogo::newton_schulz(bufs[k]).to(torch::kFloat);
      want[k] = (want[k] * (1.0 - o.lr() * o.weight_decay())).add(O, -o.lr());
    }
    EXPECT_TRUE(bit_identical(values(params), want)) << "step " << step;
  }
  // NS(buf) is near the polar factor U V^T of buf: the update's singular values near 1 (the
  // quintic's band, within [0.6, 1.25]), whatever buf's scale.
  const auto s = torch::linalg_svdvals(fogo::newton_schulz(bufs[0]).to(torch::kFloat));
  EXPECT_GT(s.min().item<double>(), 0.6);
  EXPECT_LT(s.max().item<double>(), 1.25);
}

TEST(ThirdOptimizer, TheRoutingTableReadsItsOptionsThroughMatrixOptions) {
  const OrthoSGDOptions o(0.05);
  const torch::optim::OptimizerOptions& options = o;  // as a param group holds them
  const fogo::UpdateScale scale = fogo::update_scale(options, {4, 3, 2});
  EXPECT_EQ(scale.lr, 0.05);
  EXPECT_EQ(scale.rms_per_lr, 1.0 / std::sqrt(6.0));
  EXPECT_EQ(scale.text, o.update_scale({4, 3, 2}).text);
  EXPECT_EQ(fogo::treated_as(options, {4, 3, 2}),
            "one 4x6 matrix (its trailing dimensions flattened)");
}

// The frame checks what it owns before anything changes, for an optimizer that checks nothing
// itself: a CUDA graph's parameters on a CUDA device.
TEST(ThirdOptimizer, TheFrameRefusesACudaGraphGroupOnTheCpuAndChangesNothing) {
  auto params = make_params();
  OrthoSGD opt(params, OrthoSGDOptions().cuda_graph(true));
  feed(params, 150);
  const auto before = values(params);
  fogo::test::expect_error([&] { opt.step(); }, "OrthoSGD: option 'cuda_graph'");
  EXPECT_TRUE(bit_identical(values(params), before));
  EXPECT_TRUE(opt.state().empty());
}

TEST(ThirdOptimizer, ACheckpointRoundTripContinuesBitForBit) {
  auto params = make_params();
  OrthoSGD opt(params, OrthoSGDOptions());
  for (int64_t step = 0; step < 2; ++step) feed(params, 200 + step), opt.step();
  torch::serialize::OutputArchive out;
  opt.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  auto resumed = copies(params);
  for (int64_t step = 2; step < 4; ++step) feed(params, 200 + step), opt.step();

  OrthoSGD again(resumed, OrthoSGDOptions(/*lr=*/0.5));  // the checkpoint's lr wins
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  again.load(in);
  EXPECT_EQ(again.param_groups()[0].options().get_lr(), OrthoSGDOptions().lr());
  for (int64_t step = 2; step < 4; ++step) feed(resumed, 200 + step), again.step();
  EXPECT_TRUE(bit_identical(values(resumed), values(params)));

  // A checkpoint for another model is refused and changes nothing: the next step is the one it
  // would have been.
  auto other = make_params();
  other.pop_back();
  auto twin = copies(other);
  OrthoSGD wrong(other, OrthoSGDOptions()), same(twin, OrthoSGDOptions());
  feed(other, 7), wrong.step();
  feed(twin, 7), same.step();
  std::istringstream again_bytes(bytes.str());
  torch::serialize::InputArchive bad;
  bad.load_from(again_bytes);
  fogo::test::expect_error([&] { wrong.load(bad); }, "2 parameters, this optimizer's 1");
  feed(other, 8), wrong.step();
  feed(twin, 8), same.step();
  EXPECT_TRUE(bit_identical(values(other), values(twin)));
}

TEST(ThirdOptimizer, MaskLeavesEveryBitOfAStepWithANaNGradient) {
  auto params = make_params();
  OrthoSGD opt(params, OrthoSGDOptions().nonfinite(NonFinitePolicy::Mask));
  feed(params, 300);
  opt.step();
  const auto before = values(params);
  torch::serialize::OutputArchive saved;
  opt.save(saved);
  feed(params, 301);
  params[1].mutable_grad()[2][3] = std::numeric_limits<float>::quiet_NaN();
  opt.step();
  EXPECT_TRUE(bit_identical(values(params), before));
  // The momentum buffers too: the next usable step is the one it would have been.
  auto twin = copies(params);
  OrthoSGD reference(twin, OrthoSGDOptions().nonfinite(NonFinitePolicy::Mask));
  torch::serialize::InputArchive in;
  std::ostringstream bytes;
  saved.save_to(bytes);
  std::istringstream read(bytes.str());
  in.load_from(read);
  reference.load(in);
  feed(params, 302), opt.step();
  feed(twin, 302), reference.step();
  EXPECT_TRUE(bit_identical(values(params), values(twin)));
}

namespace {

// Two ranks in one process: each steps its own optimizer on its own thread; `exchange` is a
// collective through shared memory: every rank publishes its values, then takes the owner's of
// each unit it does not own.
class TwoRanks {
 public:
  using Owns = std::function<bool(const torch::Tensor&, int64_t)>;
  fogo::StepShard shard(int rank, Owns owns) {
    return {owns, [this, rank, owns](const std::vector<fogo::ShardUnit>& units,
                                     const std::vector<std::vector<torch::Tensor>>& vals) {
              std::unique_lock<std::mutex> lock(mu_);
              for (const auto& v : vals) published_[rank].push_back(v[0].clone());
              wait(lock);
              for (size_t i = 0; i < units.size(); ++i) {
                if (!owns(units[i].param, units[i].matrix))
                  vals[i][0].copy_(published_[1 - rank][i]);
              }
              wait(lock);
              published_[rank].clear();
            }};
  }

 private:
  void wait(std::unique_lock<std::mutex>& lock) {
    const int64_t generation = generation_;
    if (++arrived_ == 2) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<torch::Tensor> published_[2];
};

}  // namespace

TEST(ThirdOptimizer, AShardedStepOnTwoRanksIsTheUnshardedStepBitForBit) {
  auto whole = make_params();
  std::vector<torch::Tensor> ranks[2] = {copies(whole), copies(whole)};
  OrthoSGD unsharded(whole, OrthoSGDOptions());
  std::vector<std::unique_ptr<OrthoSGD>> opts;
  TwoRanks world;
  for (int r = 0; r < 2; ++r) {
    opts.push_back(std::make_unique<OrthoSGD>(ranks[r], OrthoSGDOptions()));
    std::map<void*, int> owner_of;  // one parameter each
    for (size_t i = 0; i < ranks[r].size(); ++i)
      owner_of[ranks[r][i].unsafeGetTensorImpl()] = static_cast<int>(i % 2);
    opts.back()->set_step_shard(world.shard(r, [owner_of, r](const torch::Tensor& p, int64_t) {
      return owner_of.at(p.unsafeGetTensorImpl()) == r;
    }));
  }
  for (int64_t step = 0; step < 3; ++step) {
    feed(whole, 400 + step);
    unsharded.step();
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      feed(ranks[r], 400 + step);
      threads.emplace_back([&, r] { opts[r]->step(); });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(bit_identical(values(ranks[r]), values(whole)))
          << "rank " << r << " step " << step;
  }
}

TEST(ThirdOptimizer, ACudaGraphStepIsTheEagerStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto eager_params = make_params(torch::kCUDA);
  auto graph_params = copies(eager_params);
  OrthoSGD eager(eager_params, OrthoSGDOptions());
  OrthoSGD graphed(graph_params, OrthoSGDOptions().cuda_graph(true));
  for (int64_t step = 0; step < 4; ++step) {
    if (step == 2) {  // a new lr is read on the device: no new capture
      for (auto* opt : {&eager, &graphed}) opt->param_groups()[0].options().set_lr(0.01);
    }
    feed(eager_params, 500 + step), eager.step();
    feed(graph_params, 500 + step), graphed.step();
    for (size_t k = 0; k < eager_params.size(); ++k) {
      // The device lr's products round once in double, the host's as scalars: to rounding.
      EXPECT_TRUE(torch::allclose(graph_params[k], eager_params[k], 1e-5, 1e-6)) << step;
    }
  }
  EXPECT_EQ(graphed.graph_stats(0).captures, 1);
  EXPECT_EQ(graphed.graph_stats(0).replays, 4);
}

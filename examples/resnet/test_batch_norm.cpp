// batch_norm() with statistics over several ranks, checked against torch's own BatchNorm2d on
// all the rows at once. The ranks are threads of this process joined by an in-memory sum.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <barrier>
#include <thread>
#include <vector>

#include "batch_norm.h"

namespace {

using fogo::resnet::batch_norm;
using fogo::resnet::RankSum;

// A sum over `world` threads: each thread's call returns once every thread has called it, with
// the sum of the tensors the threads passed (in rank order).
class ThreadSum {
 public:
  explicit ThreadSum(int world) : slots_(world), sync_(world) {}
  RankSum of(int rank) {
    return [this, rank](torch::Tensor& t) {
      slots_[rank] = t.clone();
      sync_.arrive_and_wait();  // every rank has deposited
      auto total = slots_[0].clone();
      for (size_t r = 1; r < slots_.size(); ++r) total += slots_[r];
      sync_.arrive_and_wait();  // every rank has read before the next call overwrites
      t.copy_(total);
    };
  }

 private:
  std::vector<torch::Tensor> slots_;
  std::barrier<> sync_;
};

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm()).item<double>();
}

struct Outcome {
  torch::Tensor y, dx, dweight, dbias, running_mean, running_var;
};

// One training-mode forward and backward of `bn` on x, with loss sum(y * r).
Outcome step(torch::nn::BatchNorm2d bn, const torch::Tensor& x, const torch::Tensor& r,
             const RankSum* sum) {
  auto xg = x.clone().requires_grad_(true);
  bn->train();
  const auto y = batch_norm(bn, xg, sum);
  (y * r).sum().backward();
  return {y.detach(),
          xg.grad(),
          bn->weight.grad().clone(),
          bn->bias.grad().clone(),
          bn->running_mean.clone(),
          bn->running_var.clone()};
}

// A BatchNorm2d of C channels with non-trivial weight, bias and running statistics, the same
// for every call with one seed.
torch::nn::BatchNorm2d make_bn(int64_t channels, uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::BatchNorm2d bn(channels);
  torch::NoGradGuard no_grad;
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.uniform_(-0.5, 0.5);
  bn->running_mean.uniform_(-1, 1);
  bn->running_var.uniform_(0.5, 2);
  return bn;
}

}  // namespace

TEST(SyncBatchNorm, RanksTogetherComputeWhatOneProcessComputesOnAllRows) {
  const int64_t C = 5;
  // Three ranks with unequal rows (2, 3, 4 images of 3x4 pixels), offset and scaled so that a
  // variance computed as E[x^2] - E[x]^2 would lose most digits.
  const std::vector<int64_t> rows{2, 3, 4};
  torch::manual_seed(3);
  const auto x = torch::randn({9, C, 3, 4}) * 0.1 + 30.0;
  const auto r = torch::randn({9, C, 3, 4});
  // Truth: BatchNorm2d on all 9 rows in float64; and torch's float32 BatchNorm2d on them, whose
  // error sets the scale of what float32 can do here.
  auto bn64 = make_bn(C, 7);
  bn64->to(torch::kDouble);
  const Outcome truth = step(bn64, x.to(torch::kDouble), r.to(torch::kDouble), nullptr);
  const Outcome ref = step(make_bn(C, 7), x, r, nullptr);
  const int world = 3;
  ThreadSum sum(world);
  std::vector<Outcome> out(world);
  std::vector<torch::nn::BatchNorm2d> bns;  // made here: make_bn seeds the global generator
  for (int k = 0; k < world; ++k) bns.push_back(make_bn(C, 7));
  std::vector<std::thread> threads;
  for (int k = 0, begin = 0; k < world; begin += static_cast<int>(rows[k]), ++k) {
    threads.emplace_back([&, k, begin] {
      const RankSum mine = sum.of(k);
      out[k] = step(bns[k], x.slice(0, begin, begin + rows[k]), r.slice(0, begin, begin + rows[k]),
                    &mine);
    });
  }
  for (auto& t : threads) t.join();

  // Each result at most 4x torch's own float32 error against float64 (or 1e-6 relative): the
  // same arithmetic, with the sums in another order.
  const auto expect_as_accurate = [&](const torch::Tensor& got, const torch::Tensor& torch32,
                                      const torch::Tensor& exact, const char* what) {
    const double err = rel(got.to(torch::kDouble), exact);
    const double torch_err = rel(torch32.to(torch::kDouble), exact);
    EXPECT_LT(err, std::max(4 * torch_err, 1e-6)) << what << ": torch's error " << torch_err;
  };
  std::vector<torch::Tensor> y, dx;
  auto dweight = torch::zeros({C}), dbias = torch::zeros({C});
  for (const auto& o : out) {
    y.push_back(o.y);
    dx.push_back(o.dx);
    dweight += o.dweight;  // gradient averaging adds the ranks' shares (x world / world)
    dbias += o.dbias;
    // Every rank ends with the running statistics of all rows, bit-identical across ranks.
    expect_as_accurate(o.running_mean, ref.running_mean, truth.running_mean, "running_mean");
    expect_as_accurate(o.running_var, ref.running_var, truth.running_var, "running_var");
    EXPECT_TRUE(torch::equal(o.running_mean, out[0].running_mean));
    EXPECT_TRUE(torch::equal(o.running_var, out[0].running_var));
  }
  expect_as_accurate(torch::cat(y), ref.y, truth.y, "y");
  expect_as_accurate(torch::cat(dx), ref.dx, truth.dx, "dx");
  expect_as_accurate(dweight, ref.dweight, truth.dweight, "dweight");
  expect_as_accurate(dbias, ref.dbias, truth.dbias, "dbias");
  // The ranks' own statistics (no sum) are measurably not that: the test can tell them apart.
  const Outcome alone =
      step(make_bn(C, 7), x.slice(0, 0, rows[0]), r.slice(0, 0, rows[0]), nullptr);
  EXPECT_GT(rel(alone.y, ref.y.slice(0, 0, rows[0])), 1e-2);
}

TEST(SyncBatchNorm, OneRankAndEvalModeAreTorchsBatchNorm) {
  torch::manual_seed(4);
  const auto x = torch::randn({6, 3, 2, 2}), r = torch::randn({6, 3, 2, 2});
  const RankSum identity = [](torch::Tensor&) {};
  const Outcome ref = step(make_bn(3, 1), x, r, nullptr),
                one = step(make_bn(3, 1), x, r, &identity);
  for (const auto& [a, b] : {std::pair{one.y, ref.y},
                             {one.dx, ref.dx},
                             {one.dweight, ref.dweight},
                             {one.dbias, ref.dbias},
                             {one.running_mean, ref.running_mean},
                             {one.running_var, ref.running_var}}) {
    EXPECT_LT(rel(a, b), 1e-6);
  }
  // bf16 input (autocast): computed in float32, returned in bf16.
  auto bn = make_bn(3, 1);
  bn->train();
  EXPECT_EQ(batch_norm(bn, x.to(torch::kBFloat16), &identity).scalar_type(), torch::kBFloat16);
  // Eval mode: the running statistics, through BatchNorm2d itself (the sum is never called).
  bn->eval();
  const RankSum refuse = [](torch::Tensor&) { FAIL() << "eval mode summed over ranks"; };
  EXPECT_TRUE(torch::equal(batch_norm(bn, x, &refuse), bn(x)));
}

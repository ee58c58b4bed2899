// QK-Clip (fogo/qk_clip.h) against its definition, in float64: the attention logits recomputed
// from the clipped projections are the old ones times gamma of their group, and the group's
// largest is tau; heads at or under tau keep their bits; GQA groups; separate Q and K; row shards
// (uneven, empty) equal the whole; bad input refused before anything changes.
#include <fogo/qk_clip.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using fogo::QKHeads;
using fogo::test::expect_error;

constexpr int64_t kIn = 10, kTokens = 7;

struct Attention {
  torch::Tensor w, b, x;  // fused [q | k | v] rows, their bias, tokens [kTokens, kIn]
  QKHeads h;
};

Attention make(const QKHeads& h, int64_t seed, double scale = 1.0) {
  torch::manual_seed(seed);
  const int64_t rows = (h.q_heads + 2 * h.kv_heads) * h.head_dim;
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::randn({rows, kIn}, opts) * scale, torch::randn({rows}, opts) * 0.1,
          torch::randn({kTokens, kIn}, opts), h};
}

// Every logit q_i . k_j / sqrt(d) of each query head: [q_heads, kTokens, kTokens], from the
// definition (not from the code under test).
torch::Tensor logits(const Attention& a) {
  const auto y = torch::addmm(a.b, a.x, a.w.t());  // [tokens, rows]
  const int64_t d = a.h.head_dim, group = a.h.q_heads / a.h.kv_heads;
  std::vector<torch::Tensor> out;
  for (int64_t hq = 0; hq < a.h.q_heads; ++hq) {
    const auto q = y.narrow(1, hq * d, d);
    const auto k = y.narrow(1, (a.h.q_heads + hq / group) * d, d);
    out.push_back(q.matmul(k.t()) / std::sqrt(static_cast<double>(d)));
  }
  return torch::stack(out);
}

torch::Tensor head_max(const torch::Tensor& l) { return std::get<0>(l.flatten(1).max(1)); }

}  // namespace

// Multi-head attention with biases: clipped heads' logits are gamma times the old ones, their
// largest exactly tau; the others, and every value row, keep their bits.
TEST(QKClip, ClippedLogitsAreGammaTimesTheOldAndTheLargestIsTau) {
  for (const double alpha : {0.5, 0.0, 1.0, 0.3}) {
    Attention a = make({4, 4, 3}, 1, 1.5);
    const auto before = logits(a), m = head_max(before);
    const double tau = m.median().item<double>();  // some heads above, some at or under
    const auto w0 = a.w.clone(), b0 = a.b.clone();
    const auto gamma = fogo::qk_clip(a.w, a.b, m, a.h, tau, alpha);
    const auto after = logits(a);
    for (int64_t hq = 0; hq < 4; ++hq) {
      const double mh = m[hq].item<double>(), g = gamma[hq].item<double>();
      SCOPED_TRACE("alpha " + std::to_string(alpha) + " head " + std::to_string(hq));
      EXPECT_NEAR(g, mh > tau ? tau / mh : 1.0, 1e-15);
      EXPECT_TRUE(torch::allclose(after[hq], before[hq] * g, 1e-12, 1e-12));
      EXPECT_NEAR(head_max(after)[hq].item<double>(), std::min(mh, tau), 1e-12);
      const int64_t d = 3;
      const auto q_rows = torch::indexing::Slice(hq * d, (hq + 1) * d);
      const auto k_rows = torch::indexing::Slice((4 + hq) * d, (5 + hq) * d);
      if (mh <= tau) {  // untouched, bit for bit
        EXPECT_TRUE(torch::equal(a.w.index({q_rows}), w0.index({q_rows})));
        EXPECT_TRUE(torch::equal(a.w.index({k_rows}), w0.index({k_rows})));
      } else {  // gamma^alpha on the query rows, gamma^(1 - alpha) on the key rows
        EXPECT_TRUE(torch::allclose(a.w.index({q_rows}), w0.index({q_rows}) * std::pow(g, alpha),
                                    1e-14, 0));
        EXPECT_TRUE(torch::allclose(a.b.index({k_rows}),
                                    b0.index({k_rows}) * std::pow(g, 1 - alpha), 1e-14, 0));
      }
    }
    const auto v_rows = torch::indexing::Slice(8 * 3, 12 * 3);
    EXPECT_TRUE(torch::equal(a.w.index({v_rows}), w0.index({v_rows})));
    EXPECT_TRUE(torch::equal(a.b.index({v_rows}), b0.index({v_rows})));
  }
}

// GQA: 6 query heads, 2 key heads (3 a group). A group's gamma is its largest logit's, on all
// of its query heads and its key head: no logit of the group stays above tau, the largest is tau;
// a group all under tau is untouched.
TEST(QKClip, GroupedQueryHeadsShareTheirKeyHeadsGamma) {
  Attention a = make({6, 2, 4}, 2, 1.2);
  auto m = head_max(logits(a));
  const double tau = 0.5 * (std::get<0>(m.narrow(0, 0, 3).max(0)).item<double>());
  // Lift group 1 under tau by scaling its query rows down (its logits shrink with them).
  a.w.narrow(0, 3 * 4, 3 * 4).mul_(1e-3);
  a.b.narrow(0, 3 * 4, 3 * 4).mul_(1e-3);
  const auto before = logits(a);
  m = head_max(before);
  ASSERT_GT(std::get<0>(m.narrow(0, 0, 3).max(0)).item<double>(), tau);
  ASSERT_LE(std::get<0>(m.narrow(0, 3, 3).max(0)).item<double>(), tau);
  const auto w0 = a.w.clone();
  const auto gamma = fogo::qk_clip(a.w, a.b, m, a.h, tau);
  ASSERT_EQ(gamma.sizes(), torch::IntArrayRef({2}));
  const double g0 = gamma[0].item<double>();
  EXPECT_NEAR(g0, tau / std::get<0>(m.narrow(0, 0, 3).max(0)).item<double>(), 1e-15);
  EXPECT_EQ(gamma[1].item<double>(), 1.0);
  const auto after = logits(a);
  for (int64_t hq = 0; hq < 3; ++hq)
    EXPECT_TRUE(torch::allclose(after[hq], before[hq] * g0, 1e-12, 1e-12)) << hq;
  EXPECT_NEAR(after.narrow(0, 0, 3).max().item<double>(), tau, 1e-12);
  EXPECT_TRUE(torch::equal(after.narrow(0, 3, 3), before.narrow(0, 3, 3)));
  // Group 1's query and key rows kept their bits.
  EXPECT_TRUE(torch::equal(a.w.narrow(0, 12, 12), w0.narrow(0, 12, 12)));
  EXPECT_TRUE(torch::equal(a.w.narrow(0, 24 + 4, 4), w0.narrow(0, 24 + 4, 4)));
  EXPECT_EQ(fogo::qkv_blocks(a.h), (std::vector<int64_t>{24, 8, 8}));
}

// Separate query and key projections give the fused weight's rows, bit for bit.
TEST(QKClip, SeparateProjectionsEqualTheFusedWeight) {
  Attention a = make({4, 2, 3}, 3, 2.0);
  const auto m = head_max(logits(a));
  const double tau = m.mean().item<double>();
  auto q = a.w.narrow(0, 0, 12).clone(), k = a.w.narrow(0, 12, 6).clone();
  auto qb = a.b.narrow(0, 0, 12).clone(), kb = a.b.narrow(0, 12, 6).clone();
  const auto g_fused = fogo::qk_clip(a.w, a.b, m, a.h, tau, 0.4);
  const auto g_sep = fogo::qk_clip_separate(q, qb, k, kb, m, a.h, tau, 0.4);
  EXPECT_TRUE(torch::equal(g_fused, g_sep));
  EXPECT_TRUE(torch::equal(q, a.w.narrow(0, 0, 12)));
  EXPECT_TRUE(torch::equal(k, a.w.narrow(0, 12, 6)));
  EXPECT_TRUE(torch::equal(kb, a.b.narrow(0, 12, 6)));
  auto no_bias_q = a.w.narrow(0, 0, 12).clone();
  EXPECT_NO_THROW(fogo::qk_clip_separate(no_bias_q, {}, k, {}, m, a.h, tau));
}

// Row shards (torch.chunk's layout: ceil(rows / world) a rank, the last shorter or empty), each
// clipped with its first row, are the unsharded clip's rows bit for bit: a head's rows on two
// ranks get one factor.
TEST(QKClip, RowShardsEqualTheWholeWeight) {
  const Attention whole0 = make({4, 2, 5}, 4, 1.5);  // 40 rows
  const auto m = head_max(logits(whole0));
  const double tau = m.min().item<double>() * 0.9;  // every group clipped
  auto w = whole0.w.clone(), b = whole0.b.clone();
  fogo::qk_clip(w, b, m, whole0.h, tau);
  for (const int64_t world : {3, 7, 41}) {  // 14/14/12; 6 x 6 and 4; 40 of 1 and an empty one
    const int64_t chunk = (40 + world - 1) / world;
    for (int64_t r = 0; r < world; ++r) {
      const int64_t first = std::min(r * chunk, int64_t{40}), n = std::min(chunk, 40 - first);
      auto ws = whole0.w.narrow(0, first, n).clone(), bs = whole0.b.narrow(0, first, n).clone();
      fogo::qk_clip(ws, bs, m, whole0.h, tau, 0.5, first);
      EXPECT_TRUE(torch::equal(ws, w.narrow(0, first, n))) << world << " rank " << r;
      EXPECT_TRUE(torch::equal(bs, b.narrow(0, first, n))) << world << " rank " << r;
    }
  }
}

// Bad input: a clear error naming what is wrong, and nothing changes. A head at or under tau
// (zero, negative logits included) keeps gamma 1: no NaN from a negative base.
TEST(QKClip, BadInputIsRefusedBeforeAnythingChanges) {
  Attention a = make({4, 2, 3}, 5);
  const auto w0 = a.w.clone(), b0 = a.b.clone();
  const auto ok = torch::tensor({50.0, 2.0, -3.0, 0.0}, torch::kDouble);
  const auto unchanged = [&] {
    EXPECT_TRUE(torch::equal(a.w, w0));
    EXPECT_TRUE(torch::equal(a.b, b0));
  };
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] {
         fogo::qk_clip(a.w, a.b, torch::tensor({50.0, double(NAN), 1.0, 1.0}, torch::kDouble), a.h,
                       10);
       },
       "max_logits of query head 1 is nan"},
      {[&] {
         fogo::qk_clip(a.w, a.b, torch::tensor({50.0, 1.0, 1.0, double(INFINITY)}, torch::kDouble),
                       a.h, 10);
       },
       "max_logits of query head 3 is inf"},
      {[&] { fogo::qk_clip(a.w, a.b, ok.narrow(0, 0, 3), a.h, 10); },
       "max_logits must be a 1-D floating-point tensor of the 4 query heads"},
      {[&] {
         fogo::qk_clip(a.w, a.b, ok, {4, 3, 3}, 10);
       },
       "q_heads (4) must be a multiple of kv_heads (3)"},
      {[&] {
         fogo::qk_clip(a.w, a.b, ok, {4, 2, 4}, 10);
       },
       "the fused [q | k | v] weight has 24 rows, the heads' layout 32"},
      {[&] { fogo::qk_clip(a.w, a.b, ok, a.h, 10, 0.5, 1); },
       "holds rows 1 to 25 of a projection of 24 rows"},
      {[&] { fogo::qk_clip(a.w, a.b.narrow(0, 0, 5), ok, a.h, 10); },
       "the bias of the fused [q | k | v] weight must be 1-D with its 24 rows"},
      {[&] { fogo::qk_clip(a.w, a.b, ok, a.h, 0.0); }, "threshold must be finite and > 0"},
      {[&] { fogo::qk_clip(a.w, a.b, ok, a.h, 10, 1.5); }, "alpha must be in [0, 1]"},
      {[&] {
         auto q = a.w.narrow(0, 0, 12), k = a.w.narrow(0, 12, 4);
         fogo::qk_clip_separate(q, {}, k, {}, ok, a.h, 10);
       },
       "the key weight has 4 rows, the heads' layout 6"},
  };
  for (const auto& [call, message] : cases) {
    expect_error(call, message);
    unchanged();
  }
  const auto gamma = fogo::qk_clip(a.w, a.b, ok, a.h, 10);  // group 0 over, group 1 under
  EXPECT_NEAR(gamma[0].item<double>(), 0.2, 1e-16);
  EXPECT_EQ(gamma[1].item<double>(), 1.0);
  EXPECT_FALSE(torch::isnan(a.w).any().item<bool>());
  EXPECT_TRUE(torch::equal(a.w.narrow(0, 6, 6), w0.narrow(0, 6, 6)));  // group 1's query heads
}

// The scales in the weight's precision: a float32 weight is scaled by the float32 factor (not a
// bf16 one), on any device the weight is on.
TEST(QKClip, Float32WeightTakesTheFactorInFloat32) {
  Attention a = make({2, 2, 4}, 6, 3.0);
  const auto m = head_max(logits(a));
  auto w = a.w.to(torch::kFloat), b = a.b.to(torch::kFloat);
  const double tau = m.min().item<double>() * 0.5;
  const auto gamma = fogo::qk_clip(w, b, m, a.h, tau);
  const auto f = static_cast<float>(std::sqrt(gamma[0].item<double>()));
  EXPECT_TRUE(torch::equal(w.narrow(0, 0, 4), a.w.narrow(0, 0, 4).to(torch::kFloat) * f));
}

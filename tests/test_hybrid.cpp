// The hybrid: which side each parameter goes to, and the two optimizers stepping, scheduling
// and checkpointing as one.
#include <fogo/fogo.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include "fogo_private/frame/nonfinite.h"
#include "test_util.h"

namespace {

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    embed = register_module("embed", torch::nn::Embedding(50, 8));
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(16, 16, 3)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    head = register_module("head", torch::nn::Linear(16, 5));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = torch::relu(fc1(embed(tokens)));     // [B, T, 16]
    x = conv(x.transpose(1, 2)).transpose(1, 2);  // [B, T-2, 16]
    return head(norm(x)).mean(1);                 // [B, 5]
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear fc1{nullptr}, head{nullptr};
  torch::nn::Conv1d conv{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(TinyNet);

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

void train_steps(TinyNet& net, fogo::HybridOptimizer& opt, int64_t from, int64_t to) {
  for (int64_t k = from; k < to; ++k) {
    torch::manual_seed(100 + k);
    const auto tokens = torch::randint(0, 50, {4, 6});
    const auto target = torch::randint(0, 5, {4});
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(tokens), target).backward();
    opt.step();
  }
}

fogo::HybridOptimizer make(TinyNet& net) {
  return fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02),
                                       torch::optim::AdamWOptions(3e-3));
}

}  // namespace

TEST(SplitParameters, MatricesToMatrixSideRestToAdamW) {
  TinyNet net;
  const auto split = fogo::split_parameters(*net);
  EXPECT_EQ(sorted(split.matrix.names), (std::vector<std::string>{"conv.weight", "fc1.weight"}));
  EXPECT_EQ(sorted(split.rest.names),
            (std::vector<std::string>{"conv.bias", "embed.weight", "fc1.bias", "head.bias",
                                      "head.weight", "norm.bias", "norm.weight"}));
}

// The routing table (issue 36, item 5): every trainable parameter with its side and the rule
// that sent it there, agreeing with split_parameters; the table names each and how the matrix
// side treats it.
TEST(SplitParameters, RoutesNameEachParametersSideAndRule) {
  TinyNet net;
  fogo::ParamSplitRules rules;
  rules.rest_patterns.push_back(R"(^conv\.)");
  const auto routes = fogo::route_parameters(*net, rules);
  std::map<std::string, std::pair<bool, std::string>> got;
  for (const auto& r : routes) got[r.name] = {r.matrix, r.rule};
  const std::map<std::string, std::pair<bool, std::string>> expected = {
      {"embed.weight", {false, "embedding weight (embeddings_to_rest)"}},
      {"fc1.weight", {true, "2-D weight"}},
      {"fc1.bias", {false, "1-D (biases, norms, scalars)"}},
      {"conv.weight", {false, "rest_patterns '^conv\\.'"}},
      {"conv.bias", {false, "1-D (biases, norms, scalars)"}},
      {"norm.weight", {false, "1-D (biases, norms, scalars)"}},
      {"norm.bias", {false, "1-D (biases, norms, scalars)"}},
      {"head.weight", {false, "rest_patterns '" + fogo::ParamSplitRules().rest_patterns[0] + "'"}},
      {"head.bias", {false, "1-D (biases, norms, scalars)"}},
  };
  EXPECT_EQ(got, expected);
  // The same sides as split_parameters, in named_parameters() order.
  const auto split = fogo::split_parameters(*net, rules);
  std::vector<std::string> matrix, rest;
  for (const auto& r : routes) (r.matrix ? matrix : rest).push_back(r.name);
  EXPECT_EQ(matrix, split.matrix.names);
  EXPECT_EQ(rest, split.rest.names);
  // A pattern forcing a weight to the matrix side is named as the rule; conv weights default to
  // one flattened matrix.
  fogo::ParamSplitRules forced;
  forced.matrix_patterns = {R"(^head\.weight$)"};
  const std::string table = fogo::routing_table(fogo::route_parameters(*net, forced));
  EXPECT_NE(table.find("| head.weight | [5, 16] | matrix | matrix_patterns '^head\\.weight$' | "
                       "one 5x16 matrix |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| conv.weight | [16, 16, 3] | matrix | 3-D weight | one 16x48 matrix "
                       "(its trailing dimensions flattened) |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| embed.weight | [50, 8] | AdamW | embedding weight (embeddings_to_rest) "
                       "| as is |"),
            std::string::npos)
      << table;
}

// The update scales against their formulas in double: Muon's adjust_lr factor and the RMS of an
// orthogonal update (1 / sqrt(max(rows, cols)) per entry, checked on a real orthogonal matrix),
// FOGO's sigma, AdamW's lr alone.
TEST(SplitParameters, UpdateScalesFollowTheirFormulas) {
  const std::vector<int64_t> conv{16, 8, 3};  // the matrix view: 16 x 24
  const auto muon = [&](fogo::MuonAdjustLR rule) {
    return fogo::update_scale(fogo::MuonOptions(0.02).adjust_lr(rule), conv);
  };
  EXPECT_DOUBLE_EQ(muon(fogo::MuonAdjustLR::Original).rms_per_lr, 1.0 / std::sqrt(24.0));
  EXPECT_DOUBLE_EQ(muon(fogo::MuonAdjustLR::MatchRmsAdamW).rms_per_lr, 0.2);
  EXPECT_DOUBLE_EQ(muon(fogo::MuonAdjustLR::Spectral).rms_per_lr,
                   std::sqrt(16.0 / 24.0) / std::sqrt(24.0));
  EXPECT_DOUBLE_EQ(muon(fogo::MuonAdjustLR::Original).lr, 0.02);
  EXPECT_NE(muon(fogo::MuonAdjustLR::Spectral).text.find("(spectral)"), std::string::npos);
  // An orthogonal 16 x 24 matrix (orthonormal rows) has exactly that RMS per entry.
  const auto q = std::get<0>(torch::linalg_qr(torch::randn({24, 16}, torch::kDouble))).t();
  EXPECT_NEAR(q.square().mean().sqrt().item<double>(), 1.0 / std::sqrt(24.0), 1e-12);
  const auto fogo_scale = fogo::update_scale(fogo::FOGOOptions(1e-3).sigma(0.15), conv);
  EXPECT_DOUBLE_EQ(fogo_scale.rms_per_lr, 0.15);
  EXPECT_NE(fogo_scale.text.find("sigma"), std::string::npos) << fogo_scale.text;
  const auto adamw = fogo::update_scale(torch::optim::AdamWOptions(3e-4), {5});
  EXPECT_DOUBLE_EQ(adamw.lr, 3e-4);
  EXPECT_TRUE(std::isnan(adamw.rms_per_lr));
  EXPECT_NE(adamw.text.find("AdamW"), std::string::npos);
}

// The hybrid's own routes: every parameter's group and update scale from the group that holds it,
// a parameter placed against the split's rule says so, one the hybrid does not hold has no group.
TEST(HybridOptimizer, RoutesNameEachParametersGroupAndUpdateScale) {
  TinyNet net;
  auto opt = fogo::make_hybrid<fogo::Muon>(
      *net, fogo::MuonOptions(0.02).adjust_lr(fogo::MuonAdjustLR::MatchRmsAdamW),
      torch::optim::AdamWOptions(3e-4), {}, fogo::shape_key);
  const auto routes = opt.routes(*net);
  std::map<std::string, fogo::ParamRoute> by_name;
  for (const auto& r : routes) by_name[r.name] = r;
  ASSERT_EQ(by_name.size(), 9u);
  EXPECT_EQ(by_name["fc1.weight"].group, "16x8");
  EXPECT_EQ(by_name["conv.weight"].group, "16x48");
  EXPECT_DOUBLE_EQ(by_name["conv.weight"].scale.rms_per_lr, 0.2);
  EXPECT_DOUBLE_EQ(by_name["conv.weight"].scale.lr, 0.02);
  EXPECT_EQ(by_name["head.weight"].group, "rest");
  EXPECT_FALSE(by_name["head.weight"].matrix);
  EXPECT_DOUBLE_EQ(by_name["head.bias"].scale.lr, 3e-4);
  // A scheduler's change of lr shows in the next routes.
  opt.set_lr_factor(0.5);
  EXPECT_DOUBLE_EQ(opt.routes(*net)[1].scale.lr, 0.01);  // fc1.weight (named_parameters order)
  // By hand: fc1's weight on the AdamW side, head's weight not held at all.
  std::vector<torch::Tensor> matrix{net->conv->weight}, rest;
  for (const auto& item : net->named_parameters()) {
    if (item.key() != "conv.weight" && item.key() != "head.weight") rest.push_back(item.value());
  }
  fogo::HybridOptimizer by_hand(std::make_unique<fogo::FOGO>(matrix, fogo::FOGOOptions(1e-3)),
                                std::make_unique<torch::optim::AdamW>(rest));
  std::map<std::string, fogo::ParamRoute> held;
  for (const auto& r : by_hand.routes(*net)) held[r.name] = r;
  EXPECT_FALSE(held["fc1.weight"].matrix);
  EXPECT_EQ(held["fc1.weight"].rule, "placed by hand (the split's rule: 2-D weight)");
  EXPECT_DOUBLE_EQ(held["conv.weight"].scale.rms_per_lr, fogo::FOGOOptions().sigma());
  EXPECT_EQ(held["head.weight"].group, "");
  const std::string table = fogo::routing_table(by_hand.routes(*net));
  EXPECT_NE(table.find("| group | update scale |"), std::string::npos) << table;
  EXPECT_NE(table.find("| head.weight | [5, 16] | AdamW | rest_patterns"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| - | not in this optimizer |"), std::string::npos) << table;
  // A regex's '|' is escaped: it would end the Markdown cell.
  EXPECT_NE(table.find(R"((lm_head\|head\|classifier\|output))"), std::string::npos) << table;
}

// A fused weight's blocks and a stack's experts in the routing: treated as their matrices, each
// block shape with its own Muon scale (the first one's RMS as the number).
TEST(HybridOptimizer, RoutesShowEachParametersMatricesAndTheirScales) {
  TinyNet net;
  std::vector<torch::Tensor> rest;
  for (const auto& item : net->named_parameters()) {
    if (item.key() != "fc1.weight" && item.key() != "conv.weight") rest.push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{net->fc1->weight},
      std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.02).blocks({8, 4, 4})));
  groups.emplace_back(std::vector<torch::Tensor>{net->conv->weight},
                      std::make_unique<fogo::MuonOptions>(fogo::MuonOptions(0.02).batch_dims(1)));
  fogo::HybridOptimizer opt(std::make_unique<fogo::Muon>(groups, fogo::MuonOptions(0.02)),
                            std::make_unique<torch::optim::AdamW>(rest));
  std::map<std::string, fogo::ParamRoute> by_name;
  for (const auto& r : opt.routes(*net)) by_name[r.name] = r;
  const auto& fc1 = by_name["fc1.weight"];  // [16, 8] in blocks of 8, 4, 4 rows
  EXPECT_EQ(fc1.treated, "[8, 8] + 2 x [4, 8] matrices");
  EXPECT_DOUBLE_EQ(fc1.scale.rms_per_lr, 1.0 / std::sqrt(8.0));  // original on [8, 8]
  EXPECT_NE(fc1.scale.text.find("[8, 8]: lr 0.02 x 1 (original)"), std::string::npos)
      << fc1.scale.text;
  EXPECT_NE(fc1.scale.text.find("[4, 8]: lr 0.02 x 1 (original)"), std::string::npos)
      << fc1.scale.text;
  EXPECT_EQ(by_name["conv.weight"].treated, "16 x [16, 3] matrices");  // [16, 16, 3], batch_dims 1
  const std::string table = fogo::routing_table(opt.routes(*net));
  EXPECT_NE(table.find("| 2-D weight | [8, 8] + 2 x [4, 8] matrices |"), std::string::npos)
      << table;
}

TEST(SplitParameters, UserOverrides) {
  TinyNet net;
  fogo::ParamSplitRules rules;
  rules.matrix_patterns = {R"(^head\.weight$)"};
  rules.rest_patterns = {R"(^conv\.)"};
  const auto split = fogo::split_parameters(*net, rules);
  EXPECT_EQ(sorted(split.matrix.names), (std::vector<std::string>{"fc1.weight", "head.weight"}));

  rules.matrix_patterns = {R"(norm\.weight)"};  // 1-D: cannot go to a matrix optimizer
  EXPECT_THROW(fogo::split_parameters(*net, rules), c10::Error);
  rules.matrix_patterns = {"(unclosed"};
  EXPECT_THROW(fogo::split_parameters(*net, rules), c10::Error);
}

TEST(SplitParameters, FrozenParametersAreLeftOut) {
  TinyNet net;
  net->fc1->weight.set_requires_grad(false);
  const auto split = fogo::split_parameters(*net);
  EXPECT_EQ(split.matrix.names, std::vector<std::string>{"conv.weight"});
}

// The rule itself, on parameters described (what Python's fogo.split_parameters hands it):
// split_parameters' decisions, embeddings by the flag, and ValueErrors naming the problem.
TEST(SplitParameters, MatrixSideIsTheRuleOnDescribedParameters) {
  TinyNet net;
  std::vector<fogo::SplitInput> inputs;
  for (const auto& item : net->named_parameters())
    inputs.push_back({item.key(), item.value().sizes().vec(), item.key() == "embed.weight"});
  const auto split = fogo::split_parameters(*net);
  const std::vector<bool> sides = fogo::matrix_side(inputs, {});
  ASSERT_EQ(sides.size(), inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto& names = sides[k] ? split.matrix.names : split.rest.names;
    EXPECT_NE(std::find(names.begin(), names.end(), inputs[k].name), names.end()) << inputs[k].name;
  }
  fogo::ParamSplitRules keep_embeddings;
  keep_embeddings.embeddings_to_rest = false;
  EXPECT_EQ(fogo::matrix_side({{"embed.weight", {10, 4}, true}}, {}), std::vector<bool>{false});
  EXPECT_EQ(fogo::matrix_side({{"embed.weight", {10, 4}, true}}, keep_embeddings),
            std::vector<bool>{true});
  fogo::ParamSplitRules rules;
  rules.matrix_patterns = {R"(norm\.weight)"};
  EXPECT_THROW(fogo::matrix_side({{"norm.weight", {4}, false}}, rules), c10::ValueError);
  rules.matrix_patterns = {"(unclosed"};
  EXPECT_THROW(fogo::matrix_side({}, rules), c10::ValueError);
}

TEST(GroupBy, ShapeKeyGroupsSameShapes) {
  fogo::NamedParams params;
  for (auto shape : {std::vector<int64_t>{4, 8}, {8, 4}, {4, 8}, {4, 2, 2, 2}}) {
    params.names.push_back("p");
    params.params.push_back(torch::zeros(shape));
  }
  const auto named = fogo::group_by(params, fogo::shape_key);
  const auto& groups = named.groups;
  ASSERT_EQ(groups.size(), 2u);  // "4x8" (three, the conv viewed as 4x8) and "8x4"
  EXPECT_EQ(named.names, (std::vector<std::string>{"4x8", "8x4"}));
  EXPECT_EQ(groups[0].params().size(), 3u);
  EXPECT_EQ(groups[1].params().size(), 1u);
}

TEST(HybridOptimizer, StepsBothSidesAndScalesLr) {
  TinyNet net;
  auto opt = make(net);
  const auto fc1_before = net->fc1->weight.detach().clone();
  const auto norm_before = net->norm->weight.detach().clone();
  train_steps(net, opt, 0, 1);
  EXPECT_FALSE(torch::equal(net->fc1->weight, fc1_before));
  EXPECT_FALSE(torch::equal(net->norm->weight, norm_before));

  opt.set_lr_factor(0.5);
  EXPECT_DOUBLE_EQ(opt.matrix()->param_groups()[0].options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(opt.rest()->param_groups()[0].options().get_lr(), 1.5e-3);
  EXPECT_THROW(opt.set_lr_factor(NAN), c10::Error);

  opt.zero_grad();
  EXPECT_FALSE(net->fc1->weight.grad().defined());
  EXPECT_FALSE(net->norm->weight.grad().defined());
}

TEST(HybridOptimizer, SaveLoadContinueEqualsUninterrupted) {
  torch::manual_seed(0);
  TinyNet straight;
  TinyNet resumed;
  {
    torch::NoGradGuard guard;
    auto src = straight->parameters();
    auto dst = resumed->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  auto opt_straight = make(straight);
  opt_straight.set_lr_factor(0.7);
  train_steps(straight, opt_straight, 0, 6);

  std::stringstream checkpoint;
  {
    auto first = make(resumed);
    first.set_lr_factor(0.7);
    train_steps(resumed, first, 0, 3);
    torch::save(first, checkpoint);
  }
  auto second = make(resumed);
  torch::load(second, checkpoint);
  EXPECT_DOUBLE_EQ(second.lr_factor(), 0.7);
  train_steps(resumed, second, 3, 6);
  auto a = straight->parameters();
  auto b = resumed->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(HybridOptimizer, MismatchedCheckpointIsRejectedAndChangesNothing) {
  TinyNet net;
  auto opt = make(net);
  train_steps(net, opt, 0, 2);
  std::stringstream checkpoint;
  torch::save(opt, checkpoint);

  // Same layout, but a head of another size: the AdamW side's state no longer fits.
  TinyNet other;
  other->head = other->replace_module("head", torch::nn::Linear(16, 7));
  auto target = make(other);
  EXPECT_THROW(torch::load(target, checkpoint), c10::Error);
  EXPECT_TRUE(target.rest()->state().empty());

  // A checkpoint without a matrix side.
  auto rest_only =
      fogo::HybridOptimizer(nullptr, std::make_unique<torch::optim::AdamW>(net->parameters()));
  checkpoint.seekg(0);
  EXPECT_THROW(torch::load(rest_only, checkpoint), c10::Error);
}

TEST(HybridOptimizer, GroupsAddedLaterAreRoutedScheduledAndNamed) {
  TinyNet net;
  auto opt = make(net);
  opt.set_lr_factor(0.5);
  auto extra = torch::randn({3, 3}).requires_grad_(true);
  opt.add_param_group(torch::optim::OptimizerParamGroup(
      {extra}, std::make_unique<torch::optim::AdamWOptions>(1e-2)));
  auto extra_matrix = torch::randn({4, 4}).requires_grad_(true);
  opt.add_param_group(
      torch::optim::OptimizerParamGroup({extra_matrix}, std::make_unique<fogo::MuonOptions>(4e-2)));
  opt.set_lr_factor(0.25);  // used to throw std::out_of_range
  EXPECT_EQ(opt.base_lrs(), (std::vector<double>{0.02, 3e-3, 1e-2, 4e-2}));
  // Each side got its group, with the scaled rate.
  EXPECT_DOUBLE_EQ(opt.rest()->param_groups().back().options().get_lr(), 1e-2 * 0.25);
  EXPECT_DOUBLE_EQ(opt.matrix<fogo::Muon>()->param_groups().back().options().get_lr(), 4e-2 * 0.25);
  EXPECT_DOUBLE_EQ(opt.matrix()->param_groups().front().options().get_lr(), 0.02 * 0.25);
  EXPECT_DOUBLE_EQ(opt.rest()->param_groups().front().options().get_lr(), 3e-3 * 0.25);
  EXPECT_EQ(opt.group_name(0), "matrix");
  EXPECT_EQ(opt.group_name(2), "rest.1");
  EXPECT_EQ(opt.group_name(3), "matrix.1");
  extra.mutable_grad() = torch::ones({3, 3});
  extra_matrix.mutable_grad() = torch::randn({4, 4});
  const auto e0 = extra.detach().clone(), m0 = extra_matrix.detach().clone();
  opt.step();  // both new groups are stepped by their side
  EXPECT_FALSE(torch::equal(extra.detach(), e0));
  EXPECT_FALSE(torch::equal(extra_matrix.detach(), m0));
  // Options neither side takes are refused with their type named.
  opt.add_param_group(
      torch::optim::OptimizerParamGroup({torch::randn({2, 2}).requires_grad_(true)},
                                        std::make_unique<torch::optim::SGDOptions>(0.1)));
  fogo::test::expect_error([&] { opt.step(); }, "SGDOptions");
}

// A group added to one side directly, behind the hybrid's back, would be stepped but never
// scaled by set_lr_factor or a scheduler: the step refuses it, naming the fix, and changes nothing.
TEST(HybridOptimizer, GroupAddedToASideDirectlyIsRefusedBeforeAnythingChanges) {
  for (const bool matrix_side : {true, false}) {
    TinyNet net;
    auto opt = make(net);
    auto extra = torch::randn({4, 4}).requires_grad_(true);
    if (matrix_side) {
      opt.matrix()->add_param_group(
          torch::optim::OptimizerParamGroup({extra}, std::make_unique<fogo::MuonOptions>(4e-2)));
    } else {
      opt.rest()->add_param_group(torch::optim::OptimizerParamGroup(
          {extra}, std::make_unique<torch::optim::AdamWOptions>(1e-2)));
    }
    for (auto& p : net->parameters()) p.mutable_grad() = torch::ones_like(p);
    extra.mutable_grad() = torch::ones({4, 4});
    std::vector<torch::Tensor> before;
    for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
    const auto extra0 = extra.detach().clone();
    fogo::test::expect_error([&] { opt.step(); },
                             matrix_side
                                 ? "the matrix side has 2 param groups but the hybrid "
                                   "knows 1"
                                 : "the rest side has 2 param groups but the hybrid knows 1");
    fogo::test::expect_error([&] { opt.set_lr_factor(0.5); }, "hybrid.add_param_group");
    const auto after = net->parameters();
    for (size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(torch::equal(after[k], before[k]));
    EXPECT_TRUE(torch::equal(extra.detach(), extra0));
  }
}

TEST(HybridOptimizer, IsATorchOptimizerForSchedulersAndSaving) {
  TinyNet net;
  auto hybrid = make(net);
  torch::optim::Optimizer& opt = hybrid;  // code written for LibTorch's optimizers
  EXPECT_EQ(opt.param_groups().size(), 2u);
  size_t params = 0;
  for (const auto& group : opt.param_groups()) params += group.params().size();
  EXPECT_EQ(params, net->parameters().size());
  torch::optim::StepLR scheduler(opt, 1, 0.1);
  scheduler.step();
  scheduler.step();
  EXPECT_DOUBLE_EQ(hybrid.matrix()->param_groups()[0].options().get_lr(), 0.002);
  EXPECT_DOUBLE_EQ(hybrid.rest()->param_groups()[0].options().get_lr(), 3e-4);
  std::stringstream checkpoint;
  train_steps(net, hybrid, 0, 1);
  torch::save(opt, checkpoint);
  TinyNet other;
  auto loaded = make(other);
  torch::load(static_cast<torch::optim::Optimizer&>(loaded), checkpoint);
  EXPECT_DOUBLE_EQ(loaded.param_groups()[0].options().get_lr(), 0.002);  // options come along
  EXPECT_FALSE(loaded.matrix()->state().empty());
  opt.zero_grad();
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(HybridOptimizer, ClosureRunsWithAutogradEvenUnderNoGrad) {
  TinyNet net;
  auto opt = make(net);
  const auto before = net->fc1->weight.detach().clone();
  torch::NoGradGuard no_grad;  // as a user's evaluation code may hold
  const auto loss = opt.step([&] {
    opt.zero_grad();
    auto l = torch::nn::functional::cross_entropy(net->forward(torch::randint(0, 50, {4, 6})),
                                                  torch::randint(0, 5, {4}));
    l.backward();
    return l;
  });
  EXPECT_TRUE(loss.defined());
  EXPECT_FALSE(torch::equal(net->fc1->weight.detach(), before));
}

namespace {

// Gradients of one training step, then a NaN in one parameter's gradient.
void poisoned_grads(TinyNet& net, torch::Tensor& poisoned) {
  torch::manual_seed(7);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::randn(p.sizes());
  poisoned.mutable_grad().view(-1)[0] = NAN;
}

std::vector<torch::Tensor> snapshot(TinyNet& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool unchanged(TinyNet& net, const std::vector<torch::Tensor>& before) {
  const auto now = net->parameters();
  for (size_t i = 0; i < now.size(); ++i)
    if (!torch::equal(now[i].detach(), before[i])) return false;
  return true;
}

}  // namespace

TEST(HybridOptimizer, ChecksTheGradientsWithOneReadBack) {
  // The hybrid checks every gradient of the step for NaN/Inf in one read-back to the host (a
  // synchronisation on a GPU); its matrix side does not check them again. Alone, each optimizer
  // reads back once per step.
  for (const bool fogo_side : {true, false}) {
    TinyNet net;
    auto opt = fogo_side ? fogo::make_hybrid<fogo::FOGO>(
                               *net, fogo::FOGOOptions(0.01).proj_dim(4).codebook_size(4),
                               torch::optim::AdamWOptions(3e-3))
                         : fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.01),
                                                         torch::optim::AdamWOptions(3e-3));
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(step);
      net->zero_grad();
      net->forward(torch::randint(0, 50, {4, 6})).sum().backward();
      const int64_t before = fogo::detail::unusable_grad_reads();
      opt.step();
      EXPECT_EQ(fogo::detail::unusable_grad_reads() - before, 1) << fogo_side << " step " << step;
      const int64_t alone = fogo::detail::unusable_grad_reads();
      opt.matrix()->step();  // the side on its own still checks
      EXPECT_EQ(fogo::detail::unusable_grad_reads() - alone, 1) << fogo_side;
    }
  }
}

TEST(HybridOptimizer, NonFinitePolicyCoversBothSides) {
  for (const auto policy : {fogo::NonFinitePolicy::Skip, fogo::NonFinitePolicy::Raise}) {
    TinyNet net;
    auto opt = fogo::make_hybrid<fogo::FOGO>(
        *net, fogo::FOGOOptions(0.01).proj_dim(4).codebook_size(4).nonfinite(policy),
        torch::optim::AdamWOptions(3e-3));
    // A NaN on the AdamW side (a bias) and on the FOGO side (a weight): neither side steps.
    for (auto* poisoned : {&net->fc1->bias, &net->fc1->weight}) {
      poisoned_grads(net, *poisoned);
      const auto before = snapshot(net);
      if (policy == fogo::NonFinitePolicy::Skip) {
        opt.step();
      } else {
        fogo::test::expect_error([&] { opt.step(); }, poisoned == &net->fc1->bias
                                                          ? "HybridOptimizer (rest side)"
                                                          : "HybridOptimizer (matrix side)");
      }
      EXPECT_TRUE(unchanged(net, before)) << static_cast<int>(policy);
      EXPECT_TRUE(opt.rest()->state().empty());
    }
  }
}

namespace {

// Every tensor a hybrid step may change, copied, as integer bits (-0.0 and NaN count): the
// parameters, AdamW's moments, FOGO's momenta and codebook memory or Muon's momentum buffers.
std::vector<torch::Tensor> all_state(TinyNet& net, fogo::HybridOptimizer& opt) {
  std::vector<torch::Tensor> out;
  const auto bits = [](const torch::Tensor& t) {
    return t.detach().clone().contiguous().view(torch::kInt);
  };
  auto* f = dynamic_cast<fogo::FOGO*>(opt.matrix());
  auto* muon = dynamic_cast<fogo::Muon*>(opt.matrix());
  for (const auto& p : net->parameters()) {  // in the model's order (the state maps have none)
    out.push_back(bits(p));
    const auto key = p.unsafeGetTensorImpl();
    if (const auto it = opt.rest()->state().find(key); it != opt.rest()->state().end()) {
      const auto& a = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      out.push_back(bits(a.exp_avg()));
      out.push_back(bits(a.exp_avg_sq()));
    }
    if (f) {
      if (const auto it = f->state().find(key); it != f->state().end()) {
        const auto& s = static_cast<const fogo::FOGOParamState&>(*it->second);
        out.push_back(bits(s.slow_momentum()));
        out.push_back(bits(s.fast_momentum()));
      }
    } else if (const auto it = muon->state().find(key); it != muon->state().end()) {
      out.push_back(bits(static_cast<const fogo::MuonParamState&>(*it->second).momentum_buffer()));
    }
  }
  for (size_t g = 0; f && g < f->param_groups().size(); ++g) {
    const auto m = f->memory(g);
    for (const auto& t : {m.centroids, m.S, m.N}) out.push_back(bits(t));
  }
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!torch::equal(a[k], b[k])) return false;
  }
  return true;
}

fogo::HybridOptimizer fogo_hybrid(TinyNet& net, fogo::NonFinitePolicy policy) {
  return fogo::make_hybrid<fogo::FOGO>(
      *net, fogo::FOGOOptions(0.01).proj_dim(4).codebook_size(4).nonfinite(policy),
      torch::optim::AdamWOptions(3e-3));
}

fogo::HybridOptimizer muon_hybrid(TinyNet& net, fogo::NonFinitePolicy policy) {
  return fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02).nonfinite(policy),
                                       torch::optim::AdamWOptions(3e-3));
}

// Mask over both sides of a hybrid whose matrix side `make` builds (FOGO or Muon).
void expect_mask_keeps_both_sides(
    const std::function<fogo::HybridOptimizer(TinyNet&, fogo::NonFinitePolicy)>& make) {
  torch::manual_seed(1);
  TinyNet masked_net;
  torch::manual_seed(1);
  TinyNet raised_net;
  auto masked = make(masked_net, fogo::NonFinitePolicy::Mask);
  auto raised = make(raised_net, fogo::NonFinitePolicy::Raise);
  // Usable gradients: Mask steps both sides bit for bit as Raise does (the first step, before
  // AdamW has state, is checked on the host).
  train_steps(masked_net, masked, 0, 3);
  train_steps(raised_net, raised, 0, 3);
  ASSERT_TRUE(same(all_state(masked_net, masked), all_state(raised_net, raised)));
  // A NaN on the AdamW side (a bias), then on the matrix side (a weight): both sides step on the
  // device and every tensor keeps its bits; nothing is read back.
  const int64_t reads = fogo::detail::unusable_grad_reads();
  for (auto* poisoned : {&masked_net->fc1->bias, &masked_net->fc1->weight}) {
    poisoned_grads(masked_net, *poisoned);
    const auto before = all_state(masked_net, masked);
    masked.step();
    EXPECT_TRUE(same(all_state(masked_net, masked), before));
  }
  EXPECT_EQ(fogo::detail::unusable_grad_reads(), reads);
  if (auto* f = dynamic_cast<fogo::FOGO*>(masked.matrix()))
    EXPECT_EQ(f->telemetry()[0].skipped_steps, 2);
  // Training goes on.
  train_steps(masked_net, masked, 3, 5);
  for (const auto& p : masked_net->parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

}  // namespace

TEST(HybridOptimizer, MaskKeepsBothSidesOnTheDeviceWithoutReadingBack) {
  expect_mask_keeps_both_sides(fogo_hybrid);
  expect_mask_keeps_both_sides(muon_hybrid);
}

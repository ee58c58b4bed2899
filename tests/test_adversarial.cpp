// Adversarial inputs against every optimizer fogo ships: fogo::Muon, fogo::FOGO and the hybrid
// (FOGO and Muon flavours, AdamW on the rest), one parameterized test over subject x input.
//
// The contract checked for every combination:
//   * an accepted step writes no NaN/Inf into a parameter or into any optimizer state (every
//     tensor the optimizer checkpoints: momenta, AdamW moments, FOGO's codebook and statistics),
//     updates the parameters in place, moves no parameter further than the optimizer's update
//     scale allows, and leaves parameters without gradients bitwise alone;
//   * bad input is a c10::Error that names the parameter ("parameter i of group g", or its shape
//     through the hybrid, whose group numbering is its own) and the problem;
//   * a rejected or skipped step changes nothing: parameters bitwise equal, every checkpointed
//     tensor and value (step counters included) bitwise equal, and the optimizer still steps
//     normally once the input is fixed.
// Where the library legitimately refuses a case (a 1-D parameter given to Muon/FOGO directly,
// an N-D one to Muon with strict_2d) the refusal and its message are what is asserted.
#include <fogo/fogo_optimizer.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr double kLr = 0.02;
constexpr double kWeightDecay = 0.1;  // the same on both sides of the hybrid

enum class Subject { Muon, FOGO, HybridFOGO, HybridMuon };

enum class Input {
  ZeroGrad,
  ZeroRow,
  Scale1em30,
  Scale1e30,
  NaNRaise,
  InfRaise,
  NaNSkip,
  InfSkip,
  ProjDimAboveWideSide,
  Shape1x1,
  Shape1xN,
  ShapeNx1,
  Conv4d,
  Conv4dStrict2d,
  BFloat16,
  Float16,
  Float64,
  NonContiguous,
  NonContiguous4d,
  NoGrad,
  Empty,
  OneDim,
  OneDimAddedLater,
  GradShapeMismatch,
  SparseGrad,
  Complex,
  NonFiniteLr,
  LrAboveFloat,
  DecayFlipsSign,
};

const char* name(Subject s) {
  switch (s) {
    case Subject::Muon:
      return "Muon";
    case Subject::FOGO:
      return "FOGO";
    case Subject::HybridFOGO:
      return "HybridFOGO";
    case Subject::HybridMuon:
      return "HybridMuon";
  }
  return "?";
}

const char* name(Input i) {
  // In the order of the enumerators.
  static const char* const kNames[] = {
      "ZeroGrad",        "ZeroRow",          "Scale1em30",
      "Scale1e30",       "NaNRaise",         "InfRaise",
      "NaNSkip",         "InfSkip",          "ProjDimAboveWideSide",
      "Shape1x1",        "Shape1xN",         "ShapeNx1",
      "Conv4d",          "Conv4dStrict2d",   "BFloat16",
      "Float16",         "Float64",          "NonContiguous",
      "NonContiguous4d", "NoGrad",           "Empty",
      "OneDim",          "OneDimAddedLater", "GradShapeMismatch",
      "SparseGrad",      "Complex",          "NonFiniteLr",
      "LrAboveFloat",    "DecayFlipsSign"};
  static_assert(std::size(kNames) == static_cast<size_t>(Input::DecayFlipsSign) + 1);
  return kNames[static_cast<int>(i)];
}

bool is_hybrid(Subject s) { return s == Subject::HybridFOGO || s == Subject::HybridMuon; }
bool uses_fogo(Subject s) { return s == Subject::FOGO || s == Subject::HybridFOGO; }

// ---------------------------------------------------------------------------------------------
// Parameters

enum class Layout { Contiguous, Transposed, Permuted };

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  torch::Dtype dtype = torch::kFloat;
  Layout layout = Layout::Contiguous;
  bool has_grad = true;
};

// A random leaf in the requested layout: Transposed is a 2-D [r, c] leaf over a contiguous
// [c, r] buffer, Permuted a 4-D [a, b, c, d] leaf over a contiguous [c, d, b, a] buffer (no
// view() can flatten it).
torch::Tensor make_tensor(const std::vector<int64_t>& shape, torch::Dtype dtype, Layout layout) {
  const auto options = torch::TensorOptions().dtype(dtype);
  switch (layout) {
    case Layout::Contiguous:
      return torch::randn(shape, options);
    case Layout::Transposed:
      return torch::randn({shape[1], shape[0]}, options).t();
    case Layout::Permuted:
      return torch::randn({shape[2], shape[3], shape[1], shape[0]}, options).permute({3, 2, 0, 1});
  }
  return {};
}

// The hybrid's module: one registered parameter per spec, in order.
struct SpecModule : torch::nn::Module {
  explicit SpecModule(const std::vector<Spec>& specs) {
    for (const auto& s : specs) register_parameter(s.name, make_tensor(s.shape, s.dtype, s.layout));
  }
};

// ---------------------------------------------------------------------------------------------
// Scenarios

enum class Outcome { Accept, Reject, Skip, RejectAtConstruction };

struct Scenario {
  std::vector<Spec> specs;  // for a hybrid, the rest-side parameters are appended
  double grad_scale = 1.0;
  int64_t proj_dim = 8;
  bool strict_2d = false;
  fogo::NonFinitePolicy policy = fogo::NonFinitePolicy::Raise;
  Outcome outcome = Outcome::Accept;
  std::vector<std::string> needles;  // the error message must contain each
  std::string pattern;               // and, if set, match this (ECMAScript) regex
};

std::string shape_pattern(const std::string& shape) {
  return R"(parameter \d+ of group \d+ \(shape \[)" + shape + R"(\]\))";
}

// nullopt: the input does not apply to the subject (no Skip policy or proj_dim for Muon, no
// add_param_group on the hybrid).
std::optional<Scenario> scenario(Subject subject, Input input) {
  const bool hybrid = is_hybrid(subject);
  const std::string opt = uses_fogo(subject) ? "FOGO" : "Muon";
  Scenario s;
  s.specs = {{"w1", {4, 6}}, {"w2", {6, 3}}};
  const auto reject = [&](Outcome outcome, std::vector<std::string> needles, std::string direct,
                          std::string shape) {
    s.outcome = outcome;
    s.needles = std::move(needles);
    if (hybrid) {
      s.pattern = shape_pattern(shape);
    } else {
      s.needles.push_back(direct);
    }
  };
  switch (input) {
    case Input::ZeroGrad:
    case Input::ZeroRow:
    case Input::NoGrad:
      break;
    case Input::Scale1em30:
      s.grad_scale = 1e-30;
      break;
    case Input::Scale1e30:
      // Finite, but the squares overflow float32: the Newton–Schulz input's X / |X| would be a
      // silent zero update, AdamW's second moment Inf. Refused as non-finite gradients are.
      s.grad_scale = 1e30;
      reject(Outcome::Reject, {"Frobenius norm", "overflow", "not applied"},
             opt + ": gradient of parameter 0 of group 0", "4, 6");
      break;
    case Input::NaNRaise:  // in w2 directly; through the hybrid in a bias, on the AdamW side
      reject(Outcome::Reject, {"NaN"}, opt + ": gradient of parameter 1 of group 0", "5");
      break;
    case Input::InfRaise:  // in w1, on the matrix side
      reject(Outcome::Reject, {"Inf"}, opt + ": gradient of parameter 0 of group 0", "4, 6");
      break;
    case Input::NaNSkip:
    case Input::InfSkip:
      if (!uses_fogo(subject)) return std::nullopt;
      s.policy = fogo::NonFinitePolicy::Skip;
      s.outcome = Outcome::Skip;
      break;
    case Input::ProjDimAboveWideSide:
      if (!uses_fogo(subject)) return std::nullopt;
      s.proj_dim = 64;  // d > n = 6, the wide side of both matrices
      break;
    case Input::Shape1x1:
      s.specs = {{"w1", {1, 1}}};
      break;
    case Input::Shape1xN:
      s.specs = {{"w1", {1, 7}}};
      break;
    case Input::ShapeNx1:
      s.specs = {{"w1", {7, 1}}};
      break;
    case Input::Conv4d:
      s.specs = {{"conv", {4, 3, 2, 2}}, {"w2", {6, 3}}};
      break;
    case Input::Conv4dStrict2d:
      if (uses_fogo(subject)) return std::nullopt;
      s.specs = {{"conv", {4, 3, 2, 2}}, {"w2", {6, 3}}};
      s.strict_2d = true;
      reject(Outcome::RejectAtConstruction, {"Muon only supports 2D parameters"},
             "parameter 0 of group 0", "4, 3, 2, 2");
      break;
    case Input::BFloat16:
    case Input::Float16:
    case Input::Float64: {
      const auto dtype = input == Input::BFloat16  ? torch::kBFloat16
                         : input == Input::Float16 ? torch::kHalf
                                                   : torch::kDouble;
      for (auto& spec : s.specs) spec.dtype = dtype;
      break;
    }
    case Input::NonContiguous:
      s.specs = {{"w1", {4, 6}, torch::kFloat, Layout::Transposed},
                 {"w2", {6, 3}, torch::kFloat, Layout::Transposed}};
      break;
    case Input::NonContiguous4d:
      s.specs = {{"conv", {4, 3, 2, 2}, torch::kFloat, Layout::Permuted}, {"w2", {6, 3}}};
      break;
    case Input::Empty:
      s.specs = {{"e1", {0, 4}}, {"e2", {4, 0}}, {"w1", {3, 4}}};
      break;
    case Input::OneDim:
      // Directly: a vector and a scalar are no matrices. Through the hybrid they go to AdamW.
      s.specs = {{"w1", {4, 6}}, {"v", {5}}, {"s", {}}};
      if (!hybrid) {
        reject(Outcome::RejectAtConstruction, {"fewer than 2 dimensions"}, "parameter 1 of group 0",
               "");
      }
      break;
    case Input::OneDimAddedLater:  // add_param_group() skips the constructor's checks
      if (hybrid) return std::nullopt;
      reject(Outcome::Reject, {"fewer than 2 dimensions"}, "parameter 0 of group 1", "");
      break;
    case Input::GradShapeMismatch:  // w2's gradient transposed; through the hybrid a bias's
      reject(Outcome::Reject, {"shape"}, opt + ": gradient of parameter 1 of group 0", "5");
      break;
    case Input::SparseGrad:  // w2's gradient sparse; through the hybrid a bias's (an embedding
                             // with sparse=true sends such gradients to the AdamW side)
      reject(Outcome::Reject, {"sparse"}, "parameter 1 of group 0", "5");
      break;
    case Input::Complex:
      s.specs = {{"w1", {4, 6}, torch::kComplexFloat}, {"w2", {6, 3}}};
      reject(Outcome::Reject, {"does not support complex"}, "parameter 0 of group 0", "4, 6");
      break;
    case Input::NonFiniteLr:
      // Directly: a scheduler writes lr = NaN into the group, the step refuses it. Through the
      // hybrid: set_lr_factor(NaN) refuses it.
      s.outcome = Outcome::Reject;
      s.needles = hybrid ? std::vector<std::string>{"set_lr_factor", "finite"}
                         : std::vector<std::string>{opt + ": option 'lr'", "finite"};
      break;
    case Input::LrAboveFloat:
      // lr = 1e39: finite as a double, Inf as the float32 the update multiplies by (ATen refused
      // it half-way through the step, after Muon had changed parameters and momenta).
      if (hybrid) return std::nullopt;
      reject(Outcome::Reject,
             {opt + ": option 'lr' of param group 0 is 1e+39", "beyond the largest Float"},
             "parameter 0 of group 0", "");
      break;
    case Input::DecayFlipsSign:
      // weight_decay = 1e40: 1 - lr x weight_decay flips and grows the parameters (Inf within a
      // few steps, silently).
      if (hybrid) return std::nullopt;
      reject(Outcome::Reject, {opt + ": options 'lr' x 'weight_decay'", "flip the sign"},
             "parameter 0 of group 0", "");
      break;
  }
  if (hybrid) {
    const auto dtype =
        s.specs.front().dtype == torch::kComplexFloat ? torch::kFloat : s.specs.front().dtype;
    s.specs.push_back({"bias", {5}, dtype});
    s.specs.push_back({"gain", {}, dtype});
    if (input == Input::Empty) s.specs.push_back({"empty_bias", {0}});
  }
  if (input == Input::NoGrad) {
    s.specs[1].has_grad = false;                  // w2
    if (hybrid) s.specs.back().has_grad = false;  // gain, on the AdamW side
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Everything an optimizer checkpoints, read back from torch::save: tensors and plain values by
// path. This sees state outside Optimizer::state() too (FOGO's codebooks, the hybrid's sides).

struct Snapshot {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> values;
};

void walk(torch::serialize::InputArchive& archive, const std::string& prefix, Snapshot& out) {
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    if (value.isObject()) {
      torch::serialize::InputArchive sub;
      archive.read(key, sub);
      walk(sub, prefix + key + "/", out);
    } else if (value.isTensor()) {
      out.tensors[prefix + key] = value.toTensor();
    } else if (value.isTensorList()) {
      const auto list = value.toTensorVector();
      for (size_t k = 0; k < list.size(); ++k)
        out.tensors[prefix + key + "[" + std::to_string(k) + "]"] = list[k];
    } else {
      std::ostringstream text;
      text << value;
      out.values[prefix + key] = text.str();
    }
  }
}

template <class Saveable>
Snapshot snapshot_of(const Saveable& optimizer) {
  std::stringstream stream;
  torch::save(optimizer, stream);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  Snapshot out;
  walk(archive, "", out);
  return out;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.detach().contiguous(), y = b.detach().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

bool all_finite(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return true;
  if (!t.is_floating_point() && !t.is_complex()) return true;
  return torch::isfinite(t).all().item<bool>();
}

// ---------------------------------------------------------------------------------------------
// The subject under test

class Harness {
 public:
  Harness(Subject subject, const Scenario& s) : subject_(subject), scenario_(s) {}

  // Builds the optimizer; throws what its constructor throws.
  void build() {
    auto muon = fogo::MuonOptions(kLr).weight_decay(kWeightDecay).strict_2d(scenario_.strict_2d);
    auto fogo_options = fogo::FOGOOptions(kLr)
                            .weight_decay(kWeightDecay)
                            .proj_dim(scenario_.proj_dim)
                            .codebook_size(8)
                            .lt_candidates(4)
                            .nonfinite(scenario_.policy);
    if (is_hybrid(subject_)) {
      module_ = std::make_shared<SpecModule>(scenario_.specs);
      params_ = module_->parameters();
      const auto adamw = torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay);
      hybrid_ = std::make_unique<fogo::HybridOptimizer>(
          subject_ == Subject::HybridFOGO
              ? fogo::make_hybrid<fogo::FOGO>(*module_, fogo_options, adamw)
              : fogo::make_hybrid<fogo::Muon>(*module_, muon, adamw));
    } else {
      for (const auto& spec : scenario_.specs) {
        params_.push_back(make_tensor(spec.shape, spec.dtype, spec.layout).requires_grad_(true));
      }
      if (subject_ == Subject::FOGO) {
        direct_ = std::make_unique<fogo::FOGO>(params_, fogo_options);
      } else {
        direct_ = std::make_unique<fogo::Muon>(params_, muon);
      }
    }
  }

  torch::Tensor step() { return direct_ ? direct_->step() : hybrid_->step(); }

  Snapshot snapshot() const { return direct_ ? snapshot_of(*direct_) : snapshot_of(*hybrid_); }

  // A group added after construction (add_param_group skips the constructor's checks).
  void add_group_later(const Spec& spec) {
    auto p = make_tensor(spec.shape, spec.dtype, spec.layout).requires_grad_(true);
    // Through the torch::optim::Optimizer&: fogo::add_param_group (its own add_param_group
    // would lose a group's options on torch 2.15; param_groups.h).
    fogo::add_param_group(*direct_, torch::optim::OptimizerParamGroup({p}));
    params_.push_back(p);
    scenario_.specs.push_back(spec);
  }

  std::vector<torch::Tensor>& params() { return params_; }
  torch::optim::Optimizer* direct() { return direct_.get(); }
  fogo::HybridOptimizer* hybrid() { return hybrid_.get(); }
  const Scenario& scenario() const { return scenario_; }

  // FOGO's per-group step counters (direct FOGO only; the hybrid's are in the snapshot).
  std::vector<int64_t> fogo_steps() const {
    std::vector<int64_t> out;
    if (auto* f = dynamic_cast<const fogo::FOGO*>(direct_.get()))
      for (const auto& t : f->telemetry()) out.push_back(t.step);
    return out;
  }

 private:
  Subject subject_;
  Scenario scenario_;
  std::shared_ptr<SpecModule> module_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> direct_;
  std::unique_ptr<fogo::HybridOptimizer> hybrid_;
};

// Fresh gradients for a step: random in each parameter's own layout, times the scenario's scale,
// then the input's twist. `clean` leaves the twist out (a fixed input after a rejection).
void set_grads(Harness& h, Input input, int step, bool clean) {
  torch::manual_seed(1000 + step);
  const auto& specs = h.scenario().specs;
  auto& params = h.params();
  for (size_t k = 0; k < params.size(); ++k) {
    auto& p = params[k];
    if (!specs[k].has_grad) {
      p.mutable_grad() = torch::Tensor();
      continue;
    }
    auto g = make_tensor(specs[k].shape, specs[k].dtype, specs[k].layout);
    if (!clean && h.scenario().grad_scale != 1.0) g.mul_(h.scenario().grad_scale);
    if (input == Input::ZeroGrad) g.zero_();
    p.mutable_grad() = g;
  }
  if (clean) return;
  const bool hybrid = h.hybrid() != nullptr;
  switch (input) {
    case Input::ZeroRow:
      params[0].mutable_grad()[1].zero_();
      break;
    case Input::NaNRaise:
    case Input::NaNSkip:
      // Directly in w2; through the hybrid in the bias (AdamW side): the matrix side's policy
      // must cover the whole step.
      (hybrid ? params[2] : params[1]).mutable_grad().view(-1)[0] = NAN;
      break;
    case Input::InfRaise:
    case Input::InfSkip:
      params[0].mutable_grad()[0][1] = -INFINITY;
      break;
    case Input::GradShapeMismatch:
      if (hybrid) {
        params[2].mutable_grad() = torch::randn({6});  // the bias is [5]
      } else {
        params[1].mutable_grad() = torch::randn({3, 6});  // w2 is [6, 3]
      }
      break;
    case Input::SparseGrad:
      if (hybrid) {
        params[2].mutable_grad() = torch::randn({5}).to_sparse();
      } else {
        params[1].mutable_grad() = torch::randn({6, 3}).to_sparse();
      }
      break;
    default:
      break;
  }
}

// The largest move any subject may make in one step, per entry: decoupled decay plus an update
// of at most ~lr * sqrt(numel) (FOGO: RMS lr sigma; Muon: lr sqrt(max(1, A/B)) times entries of
// a near-orthogonal matrix; AdamW: ~lr), plus rounding in the parameter's dtype.
void expect_bounded_move(const torch::Tensor& before, const torch::Tensor& after,
                         const std::string& what) {
  if (before.numel() == 0) return;
  const auto b = before.to(torch::kDouble), a = after.detach().to(torch::kDouble);
  const double dtype_eps = before.scalar_type() == torch::kBFloat16 ? 1.0 / 128
                           : before.scalar_type() == torch::kHalf   ? 1.0 / 1024
                                                                    : 1e-6;
  const auto allowed = b.abs() * (kLr * kWeightDecay + 2 * dtype_eps) +
                       1.5 * kLr * std::sqrt(static_cast<double>(before.numel()));
  EXPECT_TRUE(((a - b).abs() <= allowed).all().item<bool>())
      << what << " moved by up to " << (a - b).abs().max().item<double>();
}

void expect_unchanged(Harness& h, const std::vector<torch::Tensor>& params_before,
                      const Snapshot& state_before, const std::vector<int64_t>& steps_before) {
  for (size_t k = 0; k < params_before.size(); ++k) {
    EXPECT_TRUE(bitwise_equal(h.params()[k], params_before[k]))
        << "parameter " << h.scenario().specs[k].name << " changed";
  }
  const Snapshot now = h.snapshot();
  EXPECT_EQ(now.values, state_before.values) << "a checkpointed value (a step counter?) changed";
  ASSERT_EQ(now.tensors.size(), state_before.tensors.size()) << "state was added or dropped";
  for (const auto& [key, t] : state_before.tensors) {
    auto it = now.tensors.find(key);
    ASSERT_NE(it, now.tensors.end()) << key;
    EXPECT_TRUE(bitwise_equal(it->second, t)) << "state " << key << " changed";
  }
  EXPECT_EQ(h.fogo_steps(), steps_before);
}

// Returns how many tensors were checked.
size_t expect_state_finite(const Harness& h, const std::string& when) {
  const Snapshot now = h.snapshot();
  for (const auto& [key, t] : now.tensors) {
    EXPECT_TRUE(all_finite(t)) << when << ": state " << key << " holds NaN/Inf";
  }
  return now.tensors.size();
}

void expect_message(const c10::Error& e, const Scenario& s) {
  const std::string message = e.what_without_backtrace();
  for (const auto& needle : s.needles) {
    EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
  }
  if (!s.pattern.empty()) {
    EXPECT_TRUE(std::regex_search(message, std::regex(s.pattern)))
        << "no match for " << s.pattern << " in: " << message;
  }
}

// Group 0's weight decay, of Muon or FOGO.
void set_weight_decay(torch::optim::Optimizer& opt, double wd) {
  auto& options = opt.param_groups()[0].options();
  if (auto* m = dynamic_cast<fogo::MuonOptions*>(&options)) m->weight_decay(wd);
  if (auto* f = dynamic_cast<fogo::FOGOOptions*>(&options)) f->weight_decay(wd);
}

// One accepted step's checks; `before` holds the parameters before it.
void expect_accepted_step(Harness& h, Input input, const std::vector<torch::Tensor>& before,
                          const std::vector<const void*>& storage, int step) {
  const auto& specs = h.scenario().specs;
  const std::string when = "after step " + std::to_string(step);
  for (size_t k = 0; k < before.size(); ++k) {
    const auto& p = h.params()[k];
    const std::string what = when + ", parameter " + specs[k].name;
    EXPECT_EQ(p.data_ptr(), storage[k]) << what << " was not updated in place";
    EXPECT_EQ(p.scalar_type(), before[k].scalar_type()) << what;
    EXPECT_EQ(p.sizes(), before[k].sizes()) << what;
    EXPECT_TRUE(all_finite(p)) << what << " holds NaN/Inf";
    if (!specs[k].has_grad) {
      EXPECT_TRUE(bitwise_equal(p, before[k])) << what << " has no gradient but changed";
      continue;
    }
    if (p.numel() > 0) EXPECT_FALSE(bitwise_equal(p, before[k])) << what << " did not step";
    expect_bounded_move(before[k], p, what);
  }
  // Every subject keeps state for a parameter that stepped (momenta, moments): a snapshot
  // without tensors would mean the finiteness check above saw nothing.
  EXPECT_GT(expect_state_finite(h, when), 0u) << when;
  if (input == Input::ZeroGrad) {
    // A zero gradient makes every subject's update zero: only the decoupled decay is left.
    for (size_t k = 0; k < before.size(); ++k) {
      EXPECT_TRUE(
          torch::allclose(h.params()[k].detach(), before[k] * (1 - kLr * kWeightDecay), 1e-6, 1e-7))
          << when << ", parameter " << specs[k].name;
    }
  }
  if (input == Input::ZeroRow) {
    // A row that never had a gradient has no momentum and is orthogonal to everything: it decays.
    EXPECT_TRUE(torch::allclose(h.params()[0].detach()[1], before[0][1] * (1 - kLr * kWeightDecay),
                                1e-6, 1e-7))
        << when;
  }
}

// ---------------------------------------------------------------------------------------------
// The test

struct Combo {
  Subject subject;
  Input input;
};

// Readable parameters in gtest's messages.
void PrintTo(const Combo& combo, std::ostream* os) {
  *os << name(combo.subject) << " x " << name(combo.input);
}

class AdversarialInput : public ::testing::TestWithParam<Combo> {};

TEST_P(AdversarialInput, Contract) {
  const auto [subject, input] = GetParam();
  const auto s = scenario(subject, input);
  ASSERT_TRUE(s.has_value());
  torch::manual_seed(0);
  Harness h(subject, *s);

  if (s->outcome == Outcome::RejectAtConstruction) {
    try {
      h.build();
      ADD_FAILURE() << "construction accepted " << name(input);
    } catch (const c10::Error& e) {
      expect_message(e, *s);
    }
    return;
  }
  ASSERT_NO_THROW(h.build());

  // One clean step first (where the input allows one), so that the state a bad step could
  // damage exists.
  if (s->outcome != Outcome::Accept && input != Input::Complex) {
    set_grads(h, input, 0, /*clean=*/true);
    ASSERT_NO_THROW(h.step());
  }
  if (input == Input::OneDimAddedLater) h.add_group_later({"v", {5}});

  const auto storage = [&] {
    std::vector<const void*> out;
    for (const auto& p : h.params()) out.push_back(p.data_ptr());
    return out;
  }();
  const int steps = s->outcome == Outcome::Accept ? 2 : 1;
  for (int step = 1; step <= steps; ++step) {
    set_grads(h, input, step, /*clean=*/false);
    // A scheduler writing lr = NaN into a group of Muon/FOGO (through the hybrid, the NaN goes
    // to set_lr_factor below).
    if (input == Input::NonFiniteLr && h.direct()) {
      h.direct()->param_groups()[0].options().set_lr(NAN);
    }
    if (input == Input::LrAboveFloat) h.direct()->param_groups()[0].options().set_lr(1e39);
    if (input == Input::DecayFlipsSign) set_weight_decay(*h.direct(), 1e40);
    std::vector<torch::Tensor> before;
    for (const auto& p : h.params()) before.push_back(p.detach().clone());
    const Snapshot state_before = h.snapshot();
    const auto steps_before = h.fogo_steps();

    switch (s->outcome) {
      case Outcome::Accept: {
        ASSERT_NO_THROW(h.step()) << name(input);
        expect_accepted_step(h, input, before, storage, step);
        auto expected_steps = steps_before;
        for (auto& n : expected_steps) ++n;
        EXPECT_EQ(h.fogo_steps(), expected_steps);
        break;
      }
      case Outcome::Skip:
        ASSERT_NO_THROW(h.step());
        expect_unchanged(h, before, state_before, steps_before);
        break;
      case Outcome::Reject:
        try {
          if (input == Input::NonFiniteLr && h.hybrid()) h.hybrid()->set_lr_factor(NAN);
          h.step();
          ADD_FAILURE() << "the step accepted " << name(input);
        } catch (const c10::Error& e) {
          expect_message(e, *s);
        }
        expect_unchanged(h, before, state_before, steps_before);
        break;
      case Outcome::RejectAtConstruction:
        break;
    }
  }

  // After a refused or skipped step the optimizer is intact: fixed input steps normally.
  if (s->outcome == Outcome::Reject || s->outcome == Outcome::Skip) {
    if (input == Input::Complex) return;  // a complex parameter stays unsupported
    if ((input == Input::NonFiniteLr || input == Input::LrAboveFloat) && h.direct())
      h.direct()->param_groups()[0].options().set_lr(kLr);
    if (input == Input::DecayFlipsSign) set_weight_decay(*h.direct(), kWeightDecay);
    set_grads(h, input, 9, /*clean=*/true);
    if (input == Input::OneDimAddedLater) h.params().back().mutable_grad() = torch::Tensor();
    std::vector<torch::Tensor> before;
    for (const auto& p : h.params()) before.push_back(p.detach().clone());
    ASSERT_NO_THROW(h.step());
    for (size_t k = 0; k < before.size(); ++k) {
      const auto& p = h.params()[k];
      EXPECT_TRUE(all_finite(p));
      if (p.grad().defined() && p.numel() > 0)
        EXPECT_FALSE(bitwise_equal(p, before[k])) << s->specs[k].name << " did not step";
    }
    expect_state_finite(h, "after the recovery step");
  }
}

std::vector<Combo> all_combos() {
  std::vector<Combo> out;
  for (const auto subject :
       {Subject::Muon, Subject::FOGO, Subject::HybridFOGO, Subject::HybridMuon}) {
    for (int i = 0; i <= static_cast<int>(Input::DecayFlipsSign); ++i) {
      const auto input = static_cast<Input>(i);
      if (scenario(subject, input)) out.push_back({subject, input});
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the faults a stored archive meets (flipped bytes, a NaN saved with the state, the
// other optimizer's archive). Each load is refused naming the problem and changes nothing.

// An optimizer of `kind` over two matrices, stepped twice; `nan` makes the second gradient NaN
// under NonFinitePolicy::Unchecked, so that the state saved holds NaN as a diverged run's does.
std::unique_ptr<torch::optim::Optimizer> stepped(const std::string& kind,
                                                 std::vector<torch::Tensor>& params, bool nan) {
  torch::manual_seed(3);
  params = {torch::randn({4, 6}).requires_grad_(true), torch::randn({6, 3}).requires_grad_(true)};
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == "Muon") {
    opt = std::make_unique<fogo::Muon>(
        params, fogo::MuonOptions(kLr).nonfinite(fogo::NonFinitePolicy::Unchecked));
  } else {
    opt = std::make_unique<fogo::FOGO>(
        params, fogo::FOGOOptions(kLr).codebook_size(8).proj_dim(4).lt_candidates(4).nonfinite(
                    fogo::NonFinitePolicy::Unchecked));
  }
  for (int step = 0; step < 2; ++step) {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
    if (nan && step == 1) params[0].mutable_grad()[0][0] = NAN;
    opt->step();
  }
  return opt;
}

std::string saved(const torch::optim::Optimizer& opt) {
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(out);
  return out.str();
}

// Loads `bytes` into `opt`; returns the error (empty when accepted).
std::string load_error(torch::optim::Optimizer& opt, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  try {
    opt.load(archive);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

class CheckpointFault : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointFault, FlippedBytesInAStateTensorAreRefused) {
  std::vector<torch::Tensor> pa, pb;
  auto a = stepped(GetParam(), pa, false);
  auto b = stepped(GetParam(), pb, false);
  for (auto& p : pb) p.mutable_grad() = torch::randn(p.sizes());
  b->step();  // b's state now differs from a's
  const Snapshot before = snapshot_of(*b);
  std::string bytes = saved(*a);
  // One bit of the first momentum's first entries, found by their bytes.
  const Snapshot sa = snapshot_of(*a);
  const auto momentum = std::find_if(sa.tensors.begin(), sa.tensors.end(), [](const auto& kv) {
    return kv.first.find("momentum") != std::string::npos && kv.second.numel() >= 4;
  });
  ASSERT_NE(momentum, sa.tensors.end());
  const auto m = momentum->second.contiguous();
  const size_t at = bytes.find(std::string(static_cast<const char*>(m.data_ptr()), 16));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] ^= 0x04;
  const std::string error = load_error(*b, bytes);
  EXPECT_NE(error.find(GetParam() + "::load: the checkpoint is corrupted"), std::string::npos)
      << error;
  const Snapshot after = snapshot_of(*b);
  for (const auto& [key, t] : before.tensors) {
    if (key.find("checksum") == std::string::npos)
      EXPECT_TRUE(bitwise_equal(after.tensors.at(key), t)) << key;
  }
  // The intact bytes load.
  EXPECT_EQ(load_error(*b, saved(*a)), "");
}

TEST_P(CheckpointFault, NonFiniteStateIsRefusedNamingTheTensor) {
  std::vector<torch::Tensor> pa, pb;
  auto a = stepped(GetParam(), pa, /*nan=*/true);
  auto b = stepped(GetParam(), pb, false);
  const Snapshot before = snapshot_of(*b);
  const std::string error = load_error(*b, saved(*a));
  EXPECT_NE(error.find(GetParam() + "::load: the checkpoint's "), std::string::npos) << error;
  EXPECT_NE(error.find("holds NaN or Inf"), std::string::npos) << error;
  const Snapshot after = snapshot_of(*b);
  ASSERT_EQ(after.tensors.size(), before.tensors.size());
  for (const auto& [key, t] : before.tensors) {
    EXPECT_TRUE(bitwise_equal(after.tensors.at(key), t)) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(Adversarial, CheckpointFault, ::testing::Values("Muon", "FOGO"));

TEST(CheckpointArchives, EachOptimizerRefusesTheOthersArchiveByName) {
  std::vector<torch::Tensor> pm, pf;
  auto muon = stepped("Muon", pm, false);
  auto fogo = stepped("FOGO", pf, false);
  // Before: an INTERNAL ASSERT asking to report a bug to PyTorch.
  std::string error = load_error(*muon, saved(*fogo));
  EXPECT_NE(error.find("Muon::load: not a Muon checkpoint (FOGO wrote it"), std::string::npos)
      << error;
  EXPECT_EQ(error.find("INTERNAL ASSERT"), std::string::npos) << error;
  error = load_error(*fogo, saved(*muon));
  EXPECT_NE(error.find("FOGO::load: not a FOGO checkpoint"), std::string::npos) << error;
}

INSTANTIATE_TEST_SUITE_P(Adversarial, AdversarialInput, ::testing::ValuesIn(all_combos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return std::string(name(info.param.subject)) + "_" +
                                  name(info.param.input);
                         });

}  // namespace

// A parameter resized between steps (model surgery: its data replaced by a tensor of another
// shape, the same tensor object) is refused naming it and both shapes, before either optimizer
// changes anything; it used to fail half-way in ATen, after Muon had moved parameters and
// momenta.
TEST(Adversarial, ParameterResizedBetweenStepsIsRefusedBeforeAnythingChanges) {
  torch::manual_seed(41);
  const auto check = [](torch::optim::Optimizer& opt, torch::Tensor& other, torch::Tensor& p,
                        const char* optimizer, const char* state) {
    for (auto* t : {&other, &p}) t->mutable_grad() = torch::randn(t->sizes());
    opt.step();
    {
      torch::NoGradGuard no_grad;
      p.set_data(torch::randn({10, 12}));
    }
    p.mutable_grad() = torch::randn({10, 12});
    other.mutable_grad() = torch::randn(other.sizes());
    const auto p0 = p.detach().clone(), other0 = other.detach().clone();
    try {
      opt.step();
      ADD_FAILURE() << optimizer << ": no error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("has shape [10, 12] but its " + std::string(state) +
                         " from earlier steps has shape [8, 12]"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("was resized"), std::string::npos) << msg;
    }
    EXPECT_TRUE(torch::equal(p.detach(), p0)) << optimizer;
    EXPECT_TRUE(torch::equal(other.detach(), other0)) << optimizer << ": another parameter moved";
  };
  {
    auto other = torch::randn({6, 12}).requires_grad_(true);
    auto p = torch::randn({8, 12}).requires_grad_(true);
    fogo::Muon opt({other, p}, fogo::MuonOptions(0.02));
    check(opt, other, p, "Muon", "momentum_buffer");
  }
  {
    auto other = torch::randn({6, 12}).requires_grad_(true);
    auto p = torch::randn({8, 12}).requires_grad_(true);
    fogo::FOGO opt({other, p}, fogo::FOGOOptions(0.01).proj_dim(8).codebook_size(4));
    check(opt, other, p, "FOGO", "slow_momentum");
  }
}

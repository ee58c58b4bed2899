#include "fogo/hybrid.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <tuple>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "fogo/fogo_optimizer.h"
#include "fogo/matrix_optimizer.h"
#include "fogo/muon.h"
#include "fogo/param_groups.h"
#include "fogo_private/frame/checks.h"
#include "fogo_private/frame/closure.h"
#include "fogo_private/frame/integrity.h"
#include "fogo_private/frame/nonfinite.h"

namespace fogo {
namespace {

std::string to_bytes(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void from_bytes(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.state().clear();  // loading only adds entries; the snapshot holds the complete state
  opt.load(archive);
}

// LibTorch's own optimizers (AdamW) load whatever a checkpoint holds; a state tensor of the
// wrong shape would only fail, obscurely, at the next step. Catch it at load time.
void check_state_shapes(const torch::optim::Optimizer& opt, const char* side) {
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto& p = groups[g].params()[i];
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      if (!adamw) continue;
      for (const auto& t : {adamw->exp_avg(), adamw->exp_avg_sq()}) {
        TORCH_CHECK(!t.defined() || t.sizes() == p.sizes(), "HybridOptimizer::load: the ", side,
                    " optimizer's checkpoint state for parameter ", i, " of group ", g,
                    " has shape ", t.sizes(), " but the parameter has shape ", p.sizes(),
                    "; the checkpoint was made for a different model");
      }
    }
  }
}

// Mask: the rest side's tensors a step changes (each stepped parameter and its AdamW moments).
// None (nullopt) when the rest side cannot be masked: not LibTorch's AdamW, or a parameter
// without state yet (its first step: then the step is checked on the host, as Skip).
std::optional<std::vector<at::Tensor>> rest_side_tensors(torch::optim::Optimizer* rest,
                                                         const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> tensors;
  if (params.empty()) return tensors;
  if (!dynamic_cast<torch::optim::AdamW*>(rest)) return std::nullopt;
  for (const auto& p : params) {
    const auto it = rest->state().find(p.unsafeGetTensorImpl());
    if (it == rest->state().end()) return std::nullopt;
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    for (const auto& t : {p, st.exp_avg(), st.exp_avg_sq(), st.max_exp_avg_sq()}) {
      if (t.defined()) tensors.push_back(t);
    }
  }
  return tensors;
}

// Makes the side's group `theirs` hold options equal to the hybrid's `mine`, copying only what
// differs: the lr is set in place (a scheduler's or set_lr_factor's change: no copy), and the
// options are copied whole only when another option differs (a user's edit of the hybrid's group,
// or of the side's). Equal is by operator== of one of `Types`, which compares every option
// (fogo's option tables: OptionTable's tests; LibTorch's AdamWOptions: its five); options of
// another type are copied at every step.
template <class... Types>
void hand_over(const torch::optim::OptimizerOptions& mine,
               torch::optim::OptimizerParamGroup& theirs) {
  torch::optim::OptimizerOptions& held = theirs.options();
  const auto is = [](const auto& options, const std::type_info& type) {
    return typeid(options) == type;
  };
  if (((is(mine, typeid(Types)) && is(held, typeid(Types))) || ...)) {
    held.set_lr(mine.get_lr());
    if (((is(mine, typeid(Types)) &&
          static_cast<const Types&>(mine) == static_cast<const Types&>(held)) ||
         ...))
      return;
  }
  theirs.set_options(mine.clone());
}

// One side's step with what the hybrid decided for the whole step: fogo's optimizers take it
// explicitly; another optimizer steps as it would alone.
void step_side(torch::optim::Optimizer& side, const StepContext& context) {
  if (auto* fogo_side = dynamic_cast<MatrixOptimizer*>(&side)) {
    fogo_side->step_with(context);
  } else {
    side.step();
  }
}

}  // namespace

std::vector<ParamRoute> HybridOptimizer::routes(const torch::nn::Module& module,
                                                const ParamSplitRules& rules) const {
  sync_options();
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const auto& p : param_groups_[g].params()) group_of.emplace(p.unsafeGetTensorImpl(), g);
  }
  std::unordered_map<std::string, const c10::TensorImpl*> tensor_of;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    tensor_of.emplace(item.key(), item.value().unsafeGetTensorImpl());
  std::vector<ParamRoute> out = route_parameters(module, rules);
  for (ParamRoute& r : out) {
    const auto it = group_of.find(tensor_of.at(r.name));
    if (it == group_of.end()) continue;
    const size_t g = it->second;
    const bool matrix = route_[g].first == Side::Matrix;
    if (matrix != r.matrix) r.rule = "placed by hand (the split's rule: " + r.rule + ")";
    r.matrix = matrix;
    r.group = group_name(g);
    r.scale = update_scale(param_groups_[g].options(), r.sizes);
    if (matrix) r.treated = treated_as(param_groups_[g].options(), r.sizes);
  }
  return out;
}

std::string shape_key(const std::string& /*name*/, const torch::Tensor& param) {
  const int64_t rows = param.dim() > 0 ? param.size(0) : 1;
  const int64_t cols = rows > 0 ? param.numel() / rows : 0;
  return std::to_string(rows) + "x" + std::to_string(cols);
}

NamedGroups group_by(const NamedParams& params, const GroupKey& key) {
  NamedGroups out;
  std::vector<std::vector<torch::Tensor>> members;
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string group = key(params.names[k], params.params[k]);
    auto it = std::find(out.names.begin(), out.names.end(), group);
    if (it == out.names.end()) {
      out.names.push_back(group);
      members.emplace_back();
      it = out.names.end() - 1;
    }
    members[it - out.names.begin()].push_back(params.params[k]);
  }
  for (auto& m : members) out.groups.emplace_back(std::move(m));
  return out;
}

namespace {

// The options the hybrid's base class keeps as its defaults: the matrix side's when there is one
// (a group added without options goes there), else the rest side's.
std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(torch::optim::Optimizer* matrix,
                                                            torch::optim::Optimizer* rest) {
  TORCH_CHECK(matrix || rest, "HybridOptimizer: both the matrix and the rest optimizer are null");
  return (matrix ? matrix : rest)->defaults().clone();
}

std::string numbered(const char* base, size_t k, size_t count) {
  return count == 1 ? std::string(base) : std::string(base) + "." + std::to_string(k);
}

}  // namespace

HybridOptimizer::HybridOptimizer(std::unique_ptr<torch::optim::Optimizer> matrix,
                                 std::unique_ptr<torch::optim::Optimizer> rest,
                                 std::vector<std::string> matrix_group_names)
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                defaults_of(matrix.get(), rest.get())),
      matrix_(std::move(matrix)),
      rest_(std::move(rest)) {
  const size_t matrix_groups = matrix_ ? matrix_->param_groups().size() : 0;
  TORCH_CHECK(matrix_group_names.empty() || matrix_group_names.size() == matrix_groups,
              "HybridOptimizer: ", matrix_group_names.size(), " names for ", matrix_groups,
              " matrix param groups");
  for (const Side s : {Side::Matrix, Side::Rest}) {
    torch::optim::Optimizer* opt = side(s);
    if (!opt) continue;
    const auto& groups = opt->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      // The hybrid's own copy of the group (same tensors, cloned options) is the one users and
      // schedulers see; sync_options() hands its options to the side.
      param_groups_.emplace_back(groups[g].params(), groups[g].options().clone());
      route_.emplace_back(s, g);
      names_.push_back(s == Side::Rest              ? numbered("rest", g, groups.size())
                       : matrix_group_names.empty() ? numbered("matrix", g, groups.size())
                                                    : matrix_group_names[g]);
    }
  }
  exact_groups_ = param_groups_.size();
  base_lrs();
}

void HybridOptimizer::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  detail::check_groups_added_exactly("HybridOptimizer", param_groups_, exact_groups_);
  detail::add_param_group_as_given(*this, group);
  exact_groups_ = param_groups_.size();
}

std::vector<torch::optim::Optimizer*> HybridOptimizer::sides() const {
  std::vector<torch::optim::Optimizer*> out;
  if (matrix_) out.push_back(matrix_.get());
  if (rest_) out.push_back(rest_.get());
  return out;
}

void HybridOptimizer::sync_options() const {
  // Groups the user added to the hybrid (add_param_group is not virtual in LibTorch, so they
  // land in param_groups_ only): route each to the side whose options type it carries, unless
  // LibTorch already replaced its options (one added around add_param_group above, param_groups.h).
  detail::check_groups_added_exactly("HybridOptimizer", param_groups_, exact_groups_);
  for (size_t g = route_.size(); g < param_groups_.size(); ++g) {
    const auto& group = param_groups_[g];
    const auto& options = group.options();
    Side s;
    if (dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
      s = Side::Rest;
    } else {
      TORCH_CHECK(matrix_ && typeid(options) == typeid(matrix_->defaults()),
                  "HybridOptimizer: param group ", g, " has options of type ",
                  c10::demangle(typeid(options).name()),
                  ", which neither side takes (AdamWOptions go to the rest side",
                  matrix_ ? ", " + c10::demangle(typeid(matrix_->defaults()).name()) +
                                " to the matrix side)"
                          : ")");
      s = Side::Matrix;
    }
    torch::optim::Optimizer* opt = side(s);
    TORCH_CHECK(opt, "HybridOptimizer: param group ", g,
                " has AdamWOptions but this hybrid has no rest side");
    const torch::optim::OptimizerParamGroup routed(group.params(), options.clone());
    fogo::add_param_group(*opt, routed);  // a fogo side's own add_param_group
    route_.emplace_back(s, opt->param_groups().size() - 1);
    names_.push_back((s == Side::Rest ? "rest." : "matrix.") +
                     std::to_string(opt->param_groups().size() - 1));
  }
  // A group added to a side directly would be stepped but never scaled by set_lr_factor or the
  // hybrid's schedulers (they see the hybrid's groups): refused before anything changes.
  for (const Side s : {Side::Matrix, Side::Rest}) {
    const torch::optim::Optimizer* opt = side(s);
    if (!opt) continue;
    const auto routed = static_cast<size_t>(
        std::count_if(route_.begin(), route_.end(), [&](const auto& r) { return r.first == s; }));
    TORCH_CHECK(opt->param_groups().size() == routed, "HybridOptimizer: the ",
                s == Side::Matrix ? "matrix" : "rest", " side has ", opt->param_groups().size(),
                " param groups but the hybrid knows ", routed,
                ": a group added to a side directly would not follow set_lr_factor or the "
                "hybrid's schedulers; add it to the hybrid instead (hybrid.add_param_group(...), "
                "routed by its options type)");
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& [s, index] = route_[g];
    hand_over<MuonOptions, FOGOOptions, torch::optim::AdamWOptions>(param_groups_[g].options(),
                                                                    side(s)->param_groups()[index]);
  }
}

void HybridOptimizer::pull_options() {
  for (size_t g = 0; g < route_.size(); ++g) {
    const auto& [s, index] = route_[g];
    param_groups_[g].set_options(side(s)->param_groups()[index].options().clone());
  }
}

const std::string& HybridOptimizer::group_name(size_t g) const {
  sync_options();
  TORCH_CHECK(g < names_.size(), "HybridOptimizer::group_name: group ", g, " does not exist (",
              names_.size(), " groups)");
  return names_[g];
}

torch::Tensor HybridOptimizer::step(LossClosure closure) {
  const torch::Tensor loss = detail::run_closure(closure);
  torch::NoGradGuard no_grad;
  sync_options();
  // Everything both sides will read is checked before either side changes anything: no
  // parameter listed twice, gradient kinds and shapes, the step's scalars (the matrix side checks
  // its own too; the rest side's AdamW would fail half-way, naming no parameter, or decay its
  // parameters by a negative factor). Then one decision for the whole step (decide_nonfinite).
  const detail::GradItems items = detail::collect_grads(
      "HybridOptimizer", param_groups_, [](size_t) {}, [](size_t, size_t, const at::Tensor&) {},
      [&](size_t g) { return weight_decay(g); });
  std::vector<at::Tensor> rest_params;
  for (size_t k = 0; k < items.params.size(); ++k) {
    if (route_[items.where[k].first].first == Side::Rest) rest_params.push_back(items.params[k]);
  }
  const auto rest = [&] { return rest_side_tensors(rest_.get(), rest_params); };
  const NonFiniteDecision decision = decide(items, [&] { return rest().has_value(); });
  if (decision.kind == NonFiniteDecision::Kind::Raise) {
    const auto [g, i] = items.where[decision.item];
    detail::throw_unusable_grad(route_[g].first == Side::Matrix ? "HybridOptimizer (matrix side)"
                                                                : "HybridOptimizer (rest side)",
                                detail::describe_param(g, i, items.params[decision.item]),
                                items.grads[decision.item]);
  }
  if (decision.kind == NonFiniteDecision::Kind::Skip) return loss;
  // Mask: the matrix side masks by the step's flag, the rest side is put back where it is false.
  const detail::MaskScope keep(decision.ok, decision.kind == NonFiniteDecision::Kind::Mask
                                                ? rest().value()
                                                : std::vector<at::Tensor>{});
  StepContext decided;
  decided.decided = decision;
  for (auto* side : sides()) step_side(*side, decided);
  keep.restore();
  return loss;
}

NonFiniteDecision HybridOptimizer::decide(const detail::GradItems& items,
                                          const std::function<bool()>& rest_maskable) const {
  // Each gradient's policy: a matrix group's own; the rest side's gradients follow the matrix
  // side's defaults (its constructor's options). Without a fogo matrix side (or with none) every
  // gradient is unchecked, as LibTorch's optimizers leave them.
  const auto* fogo_side = dynamic_cast<const MatrixOptimizer*>(matrix_.get());
  const NonFinitePolicy rest_policy =
      fogo_side ? fogo_side->default_nonfinite() : NonFinitePolicy::Unchecked;
  std::vector<NonFinitePolicy> policies;
  bool maskable = true, masked = false;
  for (const auto& [g, i] : items.where) {
    const auto& [s, index] = route_[g];
    if (s == Side::Rest) {
      policies.push_back(rest_policy);
    } else {
      policies.push_back(fogo_side ? fogo_side->nonfinite(index) : NonFinitePolicy::Unchecked);
      maskable = maskable && fogo_side && fogo_side->maskable(index);
    }
    masked = masked || policies.back() == NonFinitePolicy::Mask;
  }
  // Whether AdamW's tensors can be put back, only asked when some gradient is Mask's.
  if (masked) maskable = maskable && rest_maskable();
  return decide_nonfinite(policies, detail::usable_flags(policies, items.grads), maskable);
}

double HybridOptimizer::weight_decay(size_t g) const {
  const auto& [s, index] = route_[g];
  if (s == Side::Matrix) {
    const auto* fogo_side = dynamic_cast<const MatrixOptimizer*>(matrix_.get());
    return fogo_side ? fogo_side->weight_decay(index) : 0.0;
  }
  // LibTorch's AdamW decays decoupled, p *= 1 - lr x weight_decay, as fogo's optimizers do.
  const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&param_groups_[g].options());
  return adamw ? adamw->weight_decay() : 0.0;
}

const std::vector<double>& HybridOptimizer::base_lrs() const {
  for (size_t g = base_lrs_.size(); g < param_groups_.size(); ++g)
    base_lrs_.push_back(param_groups_[g].options().get_lr());
  return base_lrs_;
}

void HybridOptimizer::set_lr_factor(double factor) {
  TORCH_CHECK(std::isfinite(factor) && factor >= 0,
              "HybridOptimizer::set_lr_factor: factor must be finite and >= 0, got ", factor);
  sync_options();  // refuses a side's group the factor could not reach, before anything changes
  const auto& base = base_lrs();
  for (size_t g = 0; g < param_groups_.size(); ++g)
    param_groups_[g].options().set_lr(base[g] * factor);
  factor_ = factor;
}

namespace {
constexpr const char* kHybridFormat = "fogo_hybrid/format";  // detail::read_format
}  // namespace

void HybridOptimizer::save(torch::serialize::OutputArchive& archive) const {
  sync_options();
  archive.write(kHybridFormat, c10::IValue(static_cast<int64_t>(2)));
  archive.write("fogo_hybrid/lr_factor", c10::IValue(factor_));
  archive.write("fogo_hybrid/base_lrs", c10::IValue(c10::List<double>(base_lrs())));
  const char* names[] = {"matrix", "rest"};
  torch::optim::Optimizer* opts[] = {matrix_.get(), rest_.get()};
  for (int s = 0; s < 2; ++s) {
    archive.write(std::string("fogo_hybrid/has_") + names[s], c10::IValue(opts[s] != nullptr));
    if (!opts[s]) continue;
    torch::serialize::OutputArchive side(archive.compilation_unit());
    opts[s]->save(side);
    archive.write(std::string("fogo_hybrid/") + names[s], side);
  }
}

void HybridOptimizer::load(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  // Format 1 (the two-optimizer hybrid) holds the same sides and keys; format 2 is this class.
  // Each side's archive states its own format (FOGO::load, Muon::load check it).
  detail::read_format(archive, "HybridOptimizer", "fogo hybrid", kHybridFormat, 2);
  sync_options();
  archive.read("fogo_hybrid/base_lrs", value);
  std::vector<double> base_lrs = value.toDoubleVector();
  TORCH_CHECK(base_lrs.size() == param_groups_.size(), "HybridOptimizer::load: the checkpoint has ",
              base_lrs.size(), " parameter groups in all, this optimizer ", param_groups_.size());
  const char* names[] = {"matrix", "rest"};
  torch::optim::Optimizer* opts[] = {matrix_.get(), rest_.get()};
  std::vector<torch::serialize::InputArchive> inputs(2);
  for (int s = 0; s < 2; ++s) {
    archive.read(std::string("fogo_hybrid/has_") + names[s], value);
    TORCH_CHECK(value.toBool() == (opts[s] != nullptr), "HybridOptimizer::load: the checkpoint ",
                value.toBool() ? "has" : "lacks", " a ", names[s], " optimizer, this one ",
                opts[s] ? "has" : "lacks", " one");
    if (opts[s]) archive.read(std::string("fogo_hybrid/") + names[s], inputs[s]);
  }
  // Load both sides or neither: snapshot each first, and restore both if either side fails.
  std::vector<std::string> snapshots;
  for (auto* side : sides()) snapshots.push_back(to_bytes(*side));
  try {
    for (int s = 0; s < 2; ++s) {
      if (!opts[s]) continue;
      opts[s]->state().clear();  // a checkpoint replaces the state; LibTorch's load only adds
      opts[s]->load(inputs[s]);
      check_state_shapes(*opts[s], names[s]);
    }
  } catch (...) {
    size_t k = 0;
    for (auto* side : sides()) from_bytes(*side, snapshots[k++]);
    throw;
  }
  pull_options();
  archive.read("fogo_hybrid/lr_factor", value);
  base_lrs_ = std::move(base_lrs);
  factor_ = value.toDouble();
}

}  // namespace fogo

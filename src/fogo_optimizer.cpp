// fogo::FOGO: the step of ALGORITHM.md, stage by stage, in ATen operations (any device).
// The stage functions live in projection.h (Pi, lift), projected.h (slerp, filters) and
// codebook.h (memory); this file orchestrates them per codebook group and owns the state.
#include "fogo/fogo_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <tuple>
#include <utility>

#include "fogo/codebook.h"
#include "fogo/detail/checks.h"
#include "fogo/ops.h"
#include "fogo/projected.h"
#include "fogo/projection.h"

namespace fogo {

// ---------------------------------------------------------------------------------------------
// Options

namespace {

// X0 = B / (|B|_F + eps), ALGORITHM.md step 2.
NSConfig ns_config(const FOGOOptions& o, int64_t steps) {
  return fogo::ns_config(o.ns_coefficients(), steps, o.eps(), NSNormalization::AddEps,
                         o.ns_dtype());
}

}  // namespace

FOGOOptions::FOGOOptions(double lr) : lr_(lr) {}

double FOGOOptions::get_lr() const { return lr(); }
void FOGOOptions::set_lr(const double lr) { this->lr(lr); }

void FOGOOptions::validate() const {
  using detail::check_range;
  const char* F = "FOGO";
  check_range(F, "lr", lr(), 0.0, INFINITY);
  check_range(F, "weight_decay", weight_decay(), 0.0, INFINITY);
  check_range(F, "sigma", sigma(), 0.0, INFINITY);
  check_range(F, "eps", eps(), 1e-30, 1.0);
  check_range(F, "mu_s", mu_s(), 0.0, 1.0);
  check_range(F, "mu_f", mu_f(), 0.0, 1.0);
  check_range(F, "proj_dim", static_cast<double>(proj_dim()), 1, 1 << 20);
  check_range(F, "xi", xi(), 0.0, 1.0);
  check_range(F, "codebook_size", static_cast<double>(codebook_size()), 1, 1 << 20);
  check_range(F, "beta_cb", beta_cb(), 0.0, 1.0);
  check_range(F, "lambda_c", lambda_c(), 0.0, INFINITY);
  check_range(F, "r_dec", static_cast<double>(r_dec()), 0, 1 << 20);
  check_range(F, "reseed_every", static_cast<double>(reseed_every()), 0, INFINITY);
  check_range(F, "reseed_threshold", reseed_threshold(), 0.0, INFINITY);
  check_range(F, "eps_st", eps_st(), 0.0, 1.0);
  check_range(F, "gamma_hi", gamma_hi(), 0.0, INFINITY);
  check_range(F, "gamma_st_min", gamma_st_min(), 0.0, INFINITY);
  check_range(F, "gamma_st_max", gamma_st_max(), gamma_st_min(), INFINITY);
  check_range(F, "beta_r", beta_r(), 0.0, 1.0);
  check_range(F, "kappa", kappa(), 1e-30, INFINITY);
  check_range(F, "tau_plus", tau_plus(), 0.0, 1e4);
  check_range(F, "tau_minus", tau_minus(), 0.0, 1e4);
  check_range(F, "lambda_hi", lambda_hi(), 0.0, INFINITY);
  check_range(F, "eps_lt", eps_lt(), 0.0, 1.0);
  check_range(F, "gamma_lt", gamma_lt(), 0.0, INFINITY);
  check_range(F, "lt_candidates", static_cast<double>(lt_candidates()), 1, INFINITY);
  check_range(F, "freeze_per_task", static_cast<double>(freeze_per_task()), 0, INFINITY);
  check_range(F, "lambda_prox", lambda_prox(), 1e-30, INFINITY);
  TORCH_CHECK(ns_steps_slow() >= 0 && ns_steps_slow() < 100,
              "FOGO: option 'ns_steps_slow' (K_s) must be in [0, 100), got ", ns_steps_slow());
  TORCH_CHECK(ns_steps_fast() >= 0 && ns_steps_fast() < 100,
              "FOGO: option 'ns_steps_fast' (K_f) must be in [0, 100), got ", ns_steps_fast());
  fogo::validate(ns_config(*this, ns_steps_slow()));
  TORCH_CHECK(
      projection_scale() == ProjectionScale::Unit || projection_scale() == ProjectionScale::JL,
      "FOGO: option 'projection_scale' is not a known value");
  TORCH_CHECK(nonfinite() == NonFinitePolicy::Raise || nonfinite() == NonFinitePolicy::Skip,
              "FOGO: option 'nonfinite' is not a known policy");
}

// Every plain option, for (de)serialisation; the enum-valued ones are written as integers.
// clang-format off
#define FOGO_OPTION_FIELDS(X) \
  X(double, lr) \
  X(double, weight_decay) \
  X(double, sigma) \
  X(double, eps) \
  X(double, mu_s) \
  X(double, mu_f) \
  X(int64_t, ns_steps_slow) \
  X(int64_t, ns_steps_fast) \
  X(coefficients_t, ns_coefficients) \
  X(int64_t, proj_dim) \
  X(double, xi) \
  X(int64_t, codebook_size) \
  X(double, beta_cb) \
  X(double, lambda_c) \
  X(int64_t, r_dec) \
  X(int64_t, reseed_every) \
  X(double, reseed_threshold) \
  X(double, eps_st) \
  X(double, gamma_hi) \
  X(double, gamma_st_min) \
  X(double, gamma_st_max) \
  X(double, beta_r) \
  X(double, kappa) \
  X(double, tau_plus) \
  X(double, tau_minus) \
  X(double, lambda_hi) \
  X(double, eps_lt) \
  X(double, gamma_lt) \
  X(int64_t, lt_candidates) \
  X(bool, spectral_scaling) \
  X(int64_t, freeze_per_task) \
  X(bool, reinit_codebook_on_task) \
  X(double, lambda_prox) \
  X(int64_t, seed)
// clang-format on

void FOGOOptions::serialize(torch::serialize::OutputArchive& archive) const {
#define FOGO_WRITE(T, name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
  FOGO_OPTION_FIELDS(FOGO_WRITE)
#undef FOGO_WRITE
  archive.write("ns_dtype", c10::IValue(static_cast<int64_t>(ns_dtype())));
  archive.write("projection_scale", c10::IValue(static_cast<int64_t>(projection_scale())));
  archive.write("nonfinite", c10::IValue(static_cast<int64_t>(nonfinite())));
}

void FOGOOptions::serialize(torch::serialize::InputArchive& archive) {
#define FOGO_READ(T, name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(T, name)
  FOGO_OPTION_FIELDS(FOGO_READ)
#undef FOGO_READ
  c10::IValue value;
  archive.read("ns_dtype", value);
  ns_dtype(static_cast<c10::ScalarType>(value.toInt()));
  archive.read("projection_scale", value);
  projection_scale(static_cast<ProjectionScale>(value.toInt()));
  archive.read("nonfinite", value);
  nonfinite(static_cast<NonFinitePolicy>(value.toInt()));
}
bool operator==(const FOGOOptions& a, const FOGOOptions& b) {
#define FOGO_EQUAL(T, name) a.name() == b.name()&&
  return FOGO_OPTION_FIELDS(FOGO_EQUAL) a.ns_dtype() == b.ns_dtype() &&
         a.projection_scale() == b.projection_scale() && a.nonfinite() == b.nonfinite();
#undef FOGO_EQUAL
}
#undef FOGO_OPTION_FIELDS

bool operator==(const FOGOParamState& a, const FOGOParamState& b) {
  const auto same = [](const at::Tensor& x, const at::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || at::equal(x, y));
  };
  return same(a.slow_momentum(), b.slow_momentum()) && same(a.fast_momentum(), b.fast_momentum());
}

void FOGOParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(slow_momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fast_momentum);
}

void FOGOParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, slow_momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, fast_momentum);
}

// ---------------------------------------------------------------------------------------------
// State

namespace {

// Telemetry is kept on the device as one vector and read back only when asked for, so a step
// never waits on the host for it.
enum Stat : int64_t {
  kRbar,
  kGammaSt,
  kFracConflicting,
  kFracOverAligned,
  kFracLtProtected,
  kEntropy,
  kLive,
  kDeltaRatio,
  kNumStats
};

at::Generator make_cpu_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The codebook group's memory: everything of ALGORITHM.md that is not per parameter.
struct GroupMemory {
  bool initialized = false;
  int64_t step = 0;
  Codebook book;
  at::Tensor start;      ///< task-start snapshot of the centroids
  at::Tensor frozen;     ///< frozen bank [F, d]
  at::Tensor frozen_nu;  ///< importance weights [F]
  at::Tensor rbar;       ///< conflict EMA, 0-d
  at::Tensor stats;      ///< [kNumStats], last step's telemetry
  bool consolidated =
      false;          ///< consolidate() ran since the last step: freezing again adds nothing
  at::Generator gen;  ///< CPU generator: initialisation, re-seeding, candidate sampling
};

// Pi [n, d] and the lift matrix K (projection.h), and their bf16 forms for a bf16 step's
// tensor-core products: Pi_bf16 only when that is exact (unit scale), K_bf16 always.
struct Projection {
  at::Tensor Pi, K, Pi_bf16, K_bf16;
};

// One matrix parameter in the working orientation [m, n], m <= n (the projected side n is the
// larger one; ALGORITHM.md "Shapes").
struct Work {
  at::Tensor param;
  bool transposed;
  int64_t m, n;
  at::Tensor Bs, Bf;  ///< momenta, working orientation (views of the state)
  at::Tensor Os;      ///< orthogonalized slow stream in the NS compute dtype (the fast one is only
                      ///< ever projected)
  const Projection* proj;
};

// [begin, end) of each run of same-shape parameters in `work`, which is sorted by shape: a run
// shares Pi and goes through Newton–Schulz, the projection and the lift as one batch.
using ShapeRuns = std::vector<std::pair<size_t, size_t>>;

ShapeRuns shape_runs(const std::vector<Work>& work) {
  ShapeRuns runs;
  for (size_t i = 0; i < work.size(); ++i) {
    if (runs.empty() || work[i].m != work[i - 1].m || work[i].n != work[i - 1].n)
      runs.emplace_back(i, i);
    runs.back().second = i + 1;
  }
  return runs;
}

at::Tensor working_view(const at::Tensor& t, bool transposed) {
  const int64_t rows = t.size(0);
  const at::Tensor flat = t.reshape({rows, t.numel() / rows});
  return transposed ? flat.t() : flat;
}

}  // namespace

struct FOGO::Impl {
  std::vector<GroupMemory> groups;
  // One Pi per (n, d) shared by every parameter with that n (and its lift operator per lambda);
  // regenerated from the seed, never stored.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, std::string, double>, Projection>
      projections;
  mutable std::vector<FOGOTelemetry> telemetry;

  const Projection& projection(const FOGOOptions& o, int64_t n, const at::Device& device) {
    auto key =
        std::make_tuple(o.seed(), n, o.proj_dim(), static_cast<int64_t>(o.projection_scale()),
                        device.str(), o.lambda_prox());
    auto it = projections.find(key);
    if (it == projections.end()) {
      at::Tensor Pi = rademacher(o.seed(), n, o.proj_dim(), o.projection_scale(), device);
      at::Tensor K = lift_operator(Pi, o.lambda_prox());
      at::Tensor Pi_bf16 =
          o.projection_scale() == ProjectionScale::Unit ? Pi.to(at::kBFloat16) : at::Tensor();
      it = projections.emplace(key, Projection{Pi, K, Pi_bf16, K.to(at::kBFloat16)}).first;
    }
    return it->second;
  }

  GroupMemory& group(size_t g, const FOGOOptions& o) {
    while (groups.size() <= g) {
      GroupMemory fresh;
      // Unsigned arithmetic: any int64 seed is valid, and the product wraps as defined.
      fresh.gen = make_cpu_generator(static_cast<uint64_t>(o.seed()) * 1000003u + groups.size());
      groups.push_back(std::move(fresh));
    }
    return groups[g];
  }
};

namespace {

// `first`: the group's first parameter. A group shares one codebook, kept on one device.
void check_matrix(size_t group, size_t index, const at::Tensor& p, const at::Tensor& first) {
  TORCH_CHECK(p.dim() >= 2, "FOGO handles matrices and N-D weights, but ",
              detail::describe_param(group, index, p),
              " has fewer than 2 dimensions; optimize it with AdamW (see fogo::split_parameters)");
  TORCH_CHECK(p.device() == first.device(), "FOGO: the parameters of a param group share one ",
              "codebook and must be on one device, but ", detail::describe_param(group, index, p),
              " is on ", p.device(), " and the group's first parameter on ", first.device(),
              "; put each device's parameters in a param group of their own");
}

}  // namespace

FOGO::FOGO(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, FOGOOptions defaults)
    : Optimizer(param_groups, std::make_unique<FOGOOptions>(defaults)),
      impl_(std::make_unique<Impl>()) {
  defaults.validate();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const FOGOOptions&>(param_groups_[g].options());
    options.validate();
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) {
      check_matrix(g, i, param_groups_[g].params()[i], param_groups_[g].params()[0]);
    }
  }
}

FOGO::~FOGO() = default;
FOGO::FOGO(FOGO&&) noexcept = default;
FOGO& FOGO::operator=(FOGO&&) noexcept = default;

// ---------------------------------------------------------------------------------------------
// The step

namespace {

// Steps 2-3 for a whole group, per run of same-shape parameters (m, n) of the working
// orientation: the slow streams of the run through one batched Newton–Schulz chain, the fast
// streams likewise (both in one chain when K_s == K_f and the fast one takes the plain route),
// and the projections P = O Pi as one GEMM per run and stream. Sets each w.Os and returns
// (Ps, Pf) [R, d] fp32 with the rows in `work` order.
//
// The chain's input is written in the compute dtype straight from the momenta (one cast-and-copy
// pass, no fp32 stack), and O_s stays in that dtype: the update reads it as is.
//
// Only P_f = O_f Pi of the fast stream is ever used: newton_schulz_projected computes it from
// m x m Gram iterations when that takes fewer multiply-adds, with fp32/fp64 compute only (in bf16
// the Gram matrix squares the conditioning; newton_schulz.h).
//
// With unit-scale Pi (entries +-1, exact in bf16), a bf16 O times Pi is exact products summed in
// fp32 (mm_bf16_f32): tensor cores on CUDA, the same result up to summation order.
std::pair<at::Tensor, at::Tensor> orthogonalize(std::vector<Work>& work, const ShapeRuns& runs,
                                                const FOGOOptions& o) {
  const bool full_precision = o.ns_dtype() == at::kFloat || o.ns_dtype() == at::kDouble;
  std::vector<at::Tensor> Ps_parts, Pf_parts;
  for (const auto& [begin, end] : runs) {
    const int64_t m = work[begin].m, n = work[begin].n;
    const int64_t P = static_cast<int64_t>(end - begin);
    const Projection& proj = *work[begin].proj;
    const auto stacked = [&](std::initializer_list<at::Tensor Work::*> streams) {
      at::Tensor X = at::empty({P * static_cast<int64_t>(streams.size()), m, n},
                               work[begin].Bs.options().dtype(o.ns_dtype()));
      int64_t k = 0;
      for (const auto stream : streams) {
        for (size_t i = begin; i < end; ++i) X[k++].copy_(work[i].*stream);
      }
      return X;
    };
    const auto project = [&](const at::Tensor& O) {  // [B, m, n] -> [B m, d], fp32
      const at::Tensor rows = O.reshape({-1, n});
      return O.scalar_type() == at::kBFloat16 && proj.Pi_bf16.defined()
                 ? mm_bf16_f32(rows, proj.Pi_bf16)
                 : rows.to(at::kFloat).mm(proj.Pi);
    };
    const bool gram =
        full_precision && newton_schulz_projected_is_cheaper(m, n, o.proj_dim(), o.ns_steps_fast());
    at::Tensor Os, Ps, Pf;
    if (!gram && o.ns_steps_slow() == o.ns_steps_fast()) {
      const at::Tensor O =
          newton_schulz(stacked({&Work::Bs, &Work::Bf}), ns_config(o, o.ns_steps_slow()));
      const at::Tensor projected = project(O);
      Os = O.slice(0, 0, P);
      Ps = projected.slice(0, 0, P * m);
      Pf = projected.slice(0, P * m);
    } else {
      Os = newton_schulz(stacked({&Work::Bs}), ns_config(o, o.ns_steps_slow()));
      Ps = project(Os);
      const at::Tensor Bf = stacked({&Work::Bf});
      const NSConfig ns_fast = ns_config(o, o.ns_steps_fast());
      Pf = gram ? newton_schulz_projected(Bf, proj.Pi, ns_fast)
                      .reshape({-1, o.proj_dim()})
                      .to(at::kFloat)
                : project(newton_schulz(Bf, ns_fast));
    }
    for (int64_t k = 0; k < P; ++k) work[begin + k].Os = Os[k];
    Ps_parts.push_back(Ps);
    Pf_parts.push_back(Pf);
  }
  return {at::cat(Ps_parts), at::cat(Pf_parts)};
}

at::Tensor entropy(const at::Tensor& N) {
  const at::Tensor p = N / N.sum().clamp_min(1e-30);
  return -(p * at::log(p.clamp_min(1e-30))).sum();
}

}  // namespace

torch::Tensor FOGO::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }

  // Validate everything before changing anything: a bad input leaves the optimizer as it was.
  const detail::GradItems items = detail::collect_grads(
      "FOGO", param_groups_,
      [&](size_t g) { static_cast<const FOGOOptions&>(param_groups_[g].options()).validate(); },
      [&](size_t g, size_t i, const at::Tensor& p) {
        check_matrix(g, i, p, param_groups_[g].params()[0]);
      });
  const auto& [params, grads, where] = items;
  const int64_t bad = detail::first_nonfinite(grads);
  if (bad >= 0) {
    const auto& options =
        static_cast<const FOGOOptions&>(param_groups_[where[bad].first].options());
    if (options.nonfinite() == NonFinitePolicy::Skip) return loss;
    detail::throw_nonfinite("FOGO", where[bad].first, where[bad].second, params[bad]);
  }

  size_t k = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
    GroupMemory& mem = impl_->group(g, o);
    const double eps = o.eps();

    // Step 1: momenta, and the working orientation of each parameter. The momentum updates of
    // the whole group are two multi-tensor ops per stream (_foreach_*: a few launches on CUDA
    // instead of four per parameter; per tensor, the same arithmetic).
    std::vector<Work> work;
    std::vector<at::Tensor> slow, fast, G;
    for (; k < params.size() && where[k].first == g; ++k) {
      const at::Tensor& p = params[k];
      if (p.numel() == 0) continue;  // nothing to update (and no rows to orthogonalize)
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<FOGOParamState>();
        fresh->slow_momentum(at::zeros(p.sizes(), p.options().dtype(at::kFloat)));
        fresh->fast_momentum(at::zeros(p.sizes(), p.options().dtype(at::kFloat)));
        slot = std::move(fresh);
      }
      auto& st = static_cast<FOGOParamState&>(*slot);
      slow.push_back(st.slow_momentum());
      fast.push_back(st.fast_momentum());
      G.push_back(grads[k].to(at::kFloat));
      const int64_t rows = p.size(0), cols = p.numel() / rows;
      const bool transposed = rows > cols;
      Work w{p,
             transposed,
             std::min(rows, cols),
             std::max(rows, cols),
             working_view(st.slow_momentum(), transposed),
             working_view(st.fast_momentum(), transposed),
             {},
             nullptr};
      w.proj = &impl_->projection(o, w.n, p.device());
      work.push_back(std::move(w));
    }
    if (work.empty()) continue;
    at::_foreach_mul_(slow, o.mu_s());
    at::_foreach_add_(slow, G);
    at::_foreach_mul_(fast, o.mu_f());
    at::_foreach_add_(fast, G);
    std::stable_sort(work.begin(), work.end(), [](const Work& a, const Work& b) {
      return std::tie(a.m, a.n) < std::tie(b.m, b.n);
    });
    const ShapeRuns runs = shape_runs(work);

    // Step 2: Newton–Schulz; step 3: projection. Rows of all parameters form one batch.
    const auto [Ps, Pf] = orthogonalize(work, runs, o);

    // Steps 4-7 in the projected space (projected.h). On a group's first step the codebook is
    // initialised from that step's queries and nothing is filtered (ALGORITHM.md).
    const bool first = !mem.initialized;
    if (first) {
      const at::Tensor z = slerp_fuse(Ps, Pf, o.xi(), eps);
      mem.book = init_codebook(normalize_rows(z, eps), at::linalg_vector_norm(z, 2, {1}) > 0,
                               o.codebook_size(), mem.gen);
      mem.start = mem.book.centroids.clone();
      mem.rbar = at::zeros({}, z.options());
      mem.initialized = true;
    }
    at::Tensor frozen = mem.frozen, nu = mem.frozen_nu;
    if (!first && frozen.defined() && frozen.size(0) > o.lt_candidates()) {
      // A_t: lt_candidates of the frozen bank, sampled by importance.
      const at::Tensor pick = at::multinomial(nu.to(at::kDouble).cpu() + 1e-12, o.lt_candidates(),
                                              /*replacement=*/false, mem.gen)
                                  .to(frozen.device());
      frozen = frozen.index_select(0, pick);
      nu = nu.index_select(0, pick);
    }
    const ProjectedStepResult r =
        ops::projected_step(Ps, Pf, mem.book.centroids, frozen, nu, mem.rbar,
                            projected_step_params(o, /*filter=*/!first));
    mem.rbar = r.rbar;

    // Step 8: proximal lift of dz = zbar - Ps; step 9: RMS-scaled update, decoupled decay.
    // The lift is one GEMM per shape run, at the NS precision (bf16 products when the NS computes
    // in bf16, proximal_lift).
    at::Tensor delta_ratio = at::zeros({}, Ps.options());
    int64_t row = 0;
    for (const auto& [begin, end] : runs) {
      const int64_t m = work[begin].m, n = work[begin].n;
      const int64_t rows = m * static_cast<int64_t>(end - begin);
      const Projection& proj = *work[begin].proj;
      const at::Tensor delta = proximal_lift(r.dz.slice(0, row, row + rows),
                                             o.ns_dtype() == at::kBFloat16 ? proj.K_bf16 : proj.K)
                                   .view({-1, m, n});
      row += rows;
      for (size_t i = begin; i < end; ++i) {
        Work& w = work[i];
        delta_ratio +=
            ops::apply_rms_update(w.param, w.Os, delta[static_cast<int64_t>(i - begin)],
                                  w.transposed, {o.lr(), o.weight_decay(), o.sigma(), eps});
      }
    }

    // Codebook flush (after all parameters of the group have stepped), then re-seeding.
    ops::codebook_flush(mem.book, {r.m, r.s}, {o.beta_cb(), o.lambda_c(), eps, o.r_dec()});
    ++mem.step;
    mem.consolidated = false;
    if (o.reseed_every() > 0 && mem.step % o.reseed_every() == 0) {
      reseed(mem.book, r.q, r.valid, o.reseed_threshold(), mem.gen);
    }
    at::Tensor stats = at::zeros({kNumStats}, Ps.options());
    stats.slice(0, kGammaSt, kGammaSt + 4).copy_(r.stats);
    stats[kRbar] = mem.rbar;
    stats[kEntropy] = entropy(mem.book.N);
    stats[kLive] = (mem.book.N >= o.reseed_threshold()).sum();
    stats[kDeltaRatio] = delta_ratio / static_cast<double>(work.size());
    mem.stats = stats;
  }
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Task boundaries

void FOGO::consolidate() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < impl_->groups.size() && g < param_groups_.size(); ++g) {
    GroupMemory& mem = impl_->groups[g];
    const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
    if (!mem.initialized || o.freeze_per_task() == 0 || mem.consolidated) continue;
    mem.consolidated = true;
    FrozenPicks picks = select_important(mem.book, mem.start, o.freeze_per_task());
    if (mem.frozen.defined() && mem.frozen.size(0) > 0) {
      mem.frozen = at::cat({mem.frozen, picks.centroids});
      mem.frozen_nu = at::cat({mem.frozen_nu, picks.nu});
    } else {
      mem.frozen = picks.centroids;
      mem.frozen_nu = picks.nu;
    }
  }
}

void FOGO::begin_task() {
  torch::NoGradGuard no_grad;
  for (auto& [key, slot] : state_) {
    auto& st = static_cast<FOGOParamState&>(*slot);
    st.slow_momentum().zero_();
    st.fast_momentum().zero_();
  }
  for (size_t g = 0; g < impl_->groups.size() && g < param_groups_.size(); ++g) {
    GroupMemory& mem = impl_->groups[g];
    if (!mem.initialized) continue;
    const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
    mem.rbar.zero_();
    if (o.reinit_codebook_on_task()) {
      mem.initialized = false;  // re-initialised from the next step's queries
    } else {
      mem.start = mem.book.centroids.clone();
    }
  }
}

void FOGO::task_boundary() {
  consolidate();
  begin_task();
}

const std::vector<FOGOTelemetry>& FOGO::telemetry() const {
  impl_->telemetry.assign(param_groups_.size(), FOGOTelemetry{});
  for (size_t g = 0; g < impl_->groups.size() && g < param_groups_.size(); ++g) {
    const GroupMemory& mem = impl_->groups[g];
    FOGOTelemetry& t = impl_->telemetry[g];
    t.step = mem.step;
    t.frozen = mem.frozen.defined() ? mem.frozen.size(0) : 0;
    if (!mem.stats.defined()) continue;
    const at::Tensor s = mem.stats.to(at::kDouble).cpu();
    const double* v = s.data_ptr<double>();
    t.rbar = v[kRbar];
    t.gamma_st = v[kGammaSt];
    t.frac_conflicting = v[kFracConflicting];
    t.frac_over_aligned = v[kFracOverAligned];
    t.frac_lt_protected = v[kFracLtProtected];
    t.codebook_entropy = v[kEntropy];
    t.live_centroids = static_cast<int64_t>(v[kLive]);
    t.delta_ratio = v[kDeltaRatio];
  }
  return impl_->telemetry;
}

FOGO::MemoryView FOGO::memory(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "FOGO::memory: group ", group, " does not exist (",
              param_groups_.size(), " groups)");
  if (group >= impl_->groups.size() || !impl_->groups[group].initialized) return {};
  const GroupMemory& mem = impl_->groups[group];
  const auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  return {copy(mem.book.centroids), copy(mem.book.S), copy(mem.book.N), copy(mem.frozen),
          copy(mem.frozen_nu)};
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: LibTorch's optimizer archive (options, momenta) plus the group memories.

namespace {

at::Tensor or_empty(const at::Tensor& t) { return t.defined() ? t : at::empty({0}); }

// The options that lay out a group's memory: a checkpoint that differs in one of them holds a
// codebook of another size or in another projected space, which this optimizer cannot continue.
void check_same_layout(size_t group, const FOGOOptions& mine, const FOGOOptions& theirs) {
  const auto check = [&](const char* option, int64_t a, int64_t b) {
    TORCH_CHECK(a == b, "FOGO::load: group ", group, " of the checkpoint has ", option, " ", b,
                ", this optimizer ", a, "; a codebook cannot move to another ", option);
  };
  check("codebook_size", mine.codebook_size(), theirs.codebook_size());
  check("proj_dim", mine.proj_dim(), theirs.proj_dim());
  check("seed", mine.seed(), theirs.seed());
  check("projection_scale", static_cast<int64_t>(mine.projection_scale()),
        static_cast<int64_t>(theirs.projection_scale()));
}

}  // namespace

void FOGO::save(torch::serialize::OutputArchive& archive) const {
  serialize(*this, archive);
  archive.write("fogo/format", c10::IValue(static_cast<int64_t>(1)));
  archive.write("fogo/groups", c10::IValue(static_cast<int64_t>(impl_->groups.size())));
  for (size_t g = 0; g < impl_->groups.size(); ++g) {
    const GroupMemory& mem = impl_->groups[g];
    torch::serialize::OutputArchive a(archive.compilation_unit());
    a.write("initialized", c10::IValue(mem.initialized));
    a.write("step", c10::IValue(mem.step));
    a.write("centroids", or_empty(mem.book.centroids), /*is_buffer=*/true);
    a.write("S", or_empty(mem.book.S), true);
    a.write("N", or_empty(mem.book.N), true);
    a.write("start", or_empty(mem.start), true);
    a.write("frozen", or_empty(mem.frozen), true);
    a.write("frozen_nu", or_empty(mem.frozen_nu), true);
    a.write("rbar", or_empty(mem.rbar), true);
    a.write("stats", or_empty(mem.stats), true);
    a.write("generator", mem.gen.get_state(), true);
    a.write("consolidated", c10::IValue(mem.consolidated));
    archive.write("fogo/group/" + std::to_string(g), a);
  }
}

void FOGO::load(torch::serialize::InputArchive& archive) {
  std::vector<GroupMemory> loaded;
  detail::load_transactional(
      *this,
      [&] {
        c10::IValue value;
        TORCH_CHECK(archive.try_read("fogo/format", value) && value.toInt() == 1,
                    "FOGO::load: not a FOGO checkpoint (format 1)");
        std::vector<FOGOOptions> before;
        for (const auto& group : param_groups_)
          before.push_back(static_cast<const FOGOOptions&>(group.options()));
        serialize(*this, archive);
        for (size_t g = 0; g < before.size() && g < param_groups_.size(); ++g) {
          check_same_layout(g, before[g],
                            static_cast<const FOGOOptions&>(param_groups_[g].options()));
        }
        archive.read("fogo/groups", value);
        const int64_t count = value.toInt();
        TORCH_CHECK(count <= static_cast<int64_t>(param_groups_.size()),
                    "FOGO::load: the checkpoint has memory for ", count, " groups, this optimizer ",
                    param_groups_.size(), " groups");
        for (int64_t g = 0; g < count; ++g) {
          const auto& o = static_cast<const FOGOOptions&>(param_groups_[g].options());
          const at::Device device = param_groups_[g].params().empty()
                                        ? at::Device(at::kCPU)
                                        : param_groups_[g].params()[0].device();
          torch::serialize::InputArchive a;
          archive.read("fogo/group/" + std::to_string(g), a);
          GroupMemory mem;
          a.read("initialized", value);
          mem.initialized = value.toBool();
          a.read("step", value);
          mem.step = value.toInt();
          mem.consolidated = a.try_read("consolidated", value) && value.toBool();
          auto tensor = [&](const char* name) {
            at::Tensor t;
            a.read(name, t, /*is_buffer=*/true);
            return t.numel() == 0 && t.dim() == 1 ? at::Tensor() : t.to(device);
          };
          mem.book.centroids = tensor("centroids");
          mem.book.S = tensor("S");
          mem.book.N = tensor("N");
          mem.start = tensor("start");
          mem.frozen = tensor("frozen");
          mem.frozen_nu = tensor("frozen_nu");
          mem.rbar = tensor("rbar");
          mem.stats = tensor("stats");
          at::Tensor gen_state;
          a.read("generator", gen_state, true);
          mem.gen = make_cpu_generator(0);
          mem.gen.set_state(gen_state);
          const int64_t C = o.codebook_size(), d = o.proj_dim();
          if (mem.initialized) {
            auto expect = [&](const at::Tensor& t, std::vector<int64_t> shape, const char* what) {
              TORCH_CHECK(t.defined() && t.sizes() == at::IntArrayRef(shape), "FOGO::load: group ",
                          g, "'s ", what, " has shape ",
                          t.defined() ? t.sizes() : at::IntArrayRef{}, ", expected ",
                          at::IntArrayRef(shape),
                          " (codebook_size C and proj_dim d must match the checkpoint's)");
            };
            expect(mem.book.centroids, {C, d}, "codebook");
            expect(mem.book.S, {C, d}, "codebook statistics S");
            expect(mem.book.N, {C}, "codebook counts N");
            expect(mem.start, {C, d}, "task-start snapshot");
            expect(mem.rbar, {}, "conflict EMA");
          }
          if (mem.frozen.defined()) {
            TORCH_CHECK(mem.frozen.dim() == 2 && mem.frozen.size(1) == d &&
                            mem.frozen_nu.defined() && mem.frozen_nu.size(0) == mem.frozen.size(0),
                        "FOGO::load: group ", g, "'s frozen bank has shape ", mem.frozen.sizes(),
                        ", expected [F, ", d, "] with F importance weights");
          }
          loaded.push_back(std::move(mem));
        }
      },
      [&](size_t g, size_t i, const torch::Tensor& p) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) return;
        auto& st = static_cast<FOGOParamState&>(*it->second);
        for (const at::Tensor& t : {st.slow_momentum(), st.fast_momentum()}) {
          TORCH_CHECK(t.defined() && t.sizes() == p.sizes(),
                      "FOGO::load: the checkpoint's momentum for ", detail::describe_param(g, i, p),
                      " has shape ", t.defined() ? t.sizes() : at::IntArrayRef{},
                      "; the checkpoint was made for a different model");
        }
        st.slow_momentum(st.slow_momentum().to(p.device()));
        st.fast_momentum(st.fast_momentum().to(p.device()));
      });
  impl_->groups = std::move(loaded);
}

// ---------------------------------------------------------------------------------------------
// Presets: the paper's "Detailed Experimental Setup" (ALGORITHM.md's table).

namespace presets {

FOGOOptions class_imbalanced_backbone() {
  return FOGOOptions(1e-3)
      .codebook_size(96)
      .proj_dim(128)
      .mu_s(0.97)
      .mu_f(0.35)
      .ns_steps_slow(5)
      .ns_steps_fast(5)
      .xi(0.25)
      .eps_st(0.15)
      .gamma_hi(0.05)
      .gamma_st_min(0.10)
      .gamma_st_max(0.30)
      .kappa(0.15)
      .beta_cb(0.95)
      .lambda_c(0.10)
      .r_dec(8)
      .reseed_every(50)
      .reseed_threshold(0.03)
      .sigma(0.1)
      .lambda_prox(1.0);
}

FOGOOptions class_imbalanced_head() { return class_imbalanced_backbone().codebook_size(64); }

FOGOOptions domain_il_backbone() {
  return class_imbalanced_backbone()
      .codebook_size(64)
      .proj_dim(128)
      .mu_s(0.95)
      .mu_f(0.35)
      .xi(0.3)
      .eps_st(0.15)
      .beta_cb(0.95)
      .reseed_every(50)
      .reseed_threshold(0.03)
      .sigma(0.1)
      .eps_lt(0.10)
      .gamma_lt(0.6)
      .freeze_per_task(21);
}

FOGOOptions domain_il_head() {
  return domain_il_backbone().codebook_size(32).proj_dim(64).gamma_lt(0.4).freeze_per_task(12);
}

FOGOOptions class_il_backbone() {
  return FOGOOptions(2e-3)
      .codebook_size(96)
      .proj_dim(256)
      .mu_s(0.97)
      .mu_f(0.20)
      .ns_steps_slow(4)
      .ns_steps_fast(4)
      .xi(0.2)
      .eps_st(0.25)
      .gamma_hi(0.01)
      .gamma_st_min(0.15)
      .gamma_st_max(0.40)
      .kappa(0.15)
      .beta_cb(0.96)
      .lambda_c(0.05)
      .r_dec(8)
      .reseed_every(50)
      .reseed_threshold(0.10)
      .sigma(0.1)
      .eps_lt(0.001)
      .gamma_lt(1.0)
      .lt_candidates(48)
      .freeze_per_task(20)
      .lambda_prox(1.0);
}

FOGOOptions class_il_head_fc() {
  return class_il_backbone().codebook_size(48).proj_dim(96).freeze_per_task(20);
}

FOGOOptions class_il_classifier() {
  return class_il_backbone().codebook_size(12).proj_dim(16).sigma(0.05).freeze_per_task(8);
}

FOGOOptions gpt2() {
  return FOGOOptions(6e-4)
      .weight_decay(0.1)
      .codebook_size(256)
      .proj_dim(512)
      .mu_s(0.95)
      .mu_f(0.15)
      .ns_steps_slow(5)
      .ns_steps_fast(5)
      .xi(0.25)
      .eps_st(0.20)
      .gamma_hi(0.001)
      .gamma_st_min(0.15)
      .gamma_st_max(0.30)
      .kappa(0.15)
      .beta_cb(0.96)
      .lambda_c(0.05)
      .r_dec(8)
      .reseed_every(200)
      .reseed_threshold(0.10)
      .sigma(0.2)
      .lambda_prox(1.0);
}

FOGOOptions lora() {
  // The table's empty LoRA cells (beta_cb, lambda_c and r, re-seeding, kappa) inherit from the
  // row above, as every other row does: the class-IL rows.
  return class_il_backbone()
      .lr(1e-3)
      .codebook_size(48)
      .proj_dim(128)
      .mu_s(0.96)
      .mu_f(0.16)
      .ns_steps_slow(5)
      .ns_steps_fast(4)
      .xi(0.25)
      .eps_st(0.20)
      .gamma_hi(0.01)
      .gamma_st_min(0.15)
      .gamma_st_max(0.45)
      .sigma(0.2)
      .eps_lt(0.05)
      .gamma_lt(1.0)
      .freeze_per_task(23)
      .lambda_prox(0.8);
}

}  // namespace presets
}  // namespace fogo

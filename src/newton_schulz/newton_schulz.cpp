#include "fogo/newton_schulz.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>

#include "fogo_private/frame/agreement.h"

#ifdef FOGO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fogo {

NSConfig ns_config(const std::tuple<double, double, double>& coefficients, int64_t steps,
                   double eps, NSNormalization normalization, c10::ScalarType compute_dtype,
                   NSForm form, int64_t gram_restart, int64_t schedule, const NSSchedule& list) {
  NSConfig ns;
  ns.coefficients = {std::get<0>(coefficients), std::get<1>(coefficients),
                     std::get<2>(coefficients)};
  ns.steps = steps;
  ns.eps = eps;
  ns.normalization = normalization;
  ns.compute_dtype = compute_dtype;
  ns.form = form;
  ns.gram_restart = gram_restart;
  ns.schedule = list.empty() ? ns_schedule(schedule, steps) : list;
  return ns;
}

void validate(const NSConfig& config) {
  TORCH_CHECK(config.steps >= 0 && config.steps < 100,
              "NSConfig.steps (ns_steps) must be in [0, 100), got ", config.steps);
  for (double coefficient : config.coefficients) {
    TORCH_CHECK(std::isfinite(coefficient),
                "NSConfig.coefficients (ns_coefficients) must be "
                "finite, got ",
                coefficient);
  }
  for (const auto& abc : config.schedule) {
    for (double coefficient : abc) {
      TORCH_CHECK(std::isfinite(coefficient),
                  "NSConfig.schedule's coefficients must be finite, got ", coefficient);
    }
  }
  TORCH_CHECK(std::isfinite(config.eps) && config.eps > 0,
              "NSConfig.eps must be finite and > 0, got ", config.eps);
  TORCH_CHECK(config.compute_dtype == at::kFloat || config.compute_dtype == at::kBFloat16 ||
                  config.compute_dtype == at::kDouble || config.compute_dtype == at::kHalf ||
                  config.compute_dtype == kNSDtypeAuto,
              "NSConfig.compute_dtype (ns_dtype) must be a real floating dtype or kNSDtypeAuto, "
              "got ",
              ns_dtype_name(config.compute_dtype));
  TORCH_CHECK(config.form == NSForm::Plain || config.form == NSForm::Gram ||
                  config.form == NSForm::Auto || config.form == NSForm::Default,
              "NSConfig.form (ns_form) is not a known value");
  TORCH_CHECK(config.gram_restart >= 0,
              "NSConfig.gram_restart (ns_gram_restart) must be >= 0, got ", config.gram_restart);
}

namespace {

// a I + P, with `a` added to P's diagonal.
at::Tensor plus_identity(const at::Tensor& P, double a) {
  at::Tensor F = P.clone();
  F.diagonal(0, -2, -1).add_(a);
  return F;
}

// The Gram form on a normalised wide batch X [batch, m, n] (newton_schulz.h): returns NS(X), or
// with Pi [n, d] defined NS(X) Pi, as Q (X Pi) with X the iterate of the last restart.
at::Tensor gram_chain(at::Tensor X, const NSConfig& config, const at::Tensor& Pi = {}) {
  at::Tensor Q;  // Q_k since the last restart; undefined stands for the identity
  if (config.steps > 0) {
    at::Tensor A = at::bmm(X, X.transpose(-2, -1));
    for (int64_t k = 0; k < config.steps; ++k) {
      const auto [a, b, c] = config.at(k);
      const at::Tensor P = c == 0.0 ? A * b : at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      Q = Q.defined() ? at::baddbmm(Q, P, Q, /*beta=*/a, /*alpha=*/1.0) : plus_identity(P, a);
      if (k + 1 == config.steps) break;
      if (config.gram_restart > 0 && (k + 1) % config.gram_restart == 0) {
        X = at::bmm(Q, X);
        Q = at::Tensor();
        A = at::bmm(X, X.transpose(-2, -1));
      } else {
        const at::Tensor FA = at::baddbmm(A, P, A, /*beta=*/a, /*alpha=*/1.0);
        A = at::baddbmm(FA, P, FA, /*beta=*/a, /*alpha=*/1.0);  // F A F: the factors commute
      }
    }
  }
  const at::Tensor right = Pi.defined() ? at::matmul(X, Pi) : X;
  return Q.defined() ? at::bmm(Q, right) : right;
}

// ---------------------------------------------------------------------------------------------
// ns_form Auto's decisions (newton_schulz.h).

#ifdef FOGO_WITH_CUDA
// One warm-up run (allocations, cuBLAS heuristics), then 3 runs between events on the current
// stream. Not inside a stream capture: nothing may synchronise there.
bool capturing(const c10::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

double time_on_cuda(const std::function<void()>& run, const c10::Device& device) {
  if (!device.is_cuda() || capturing(device)) return NAN;
  const c10::cuda::CUDAGuard guard(device);
  run();
  constexpr int kRuns = 3;
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  const auto stream = at::cuda::getCurrentCUDAStream(device.index());
  start.record(stream);
  for (int k = 0; k < kRuns; ++k) run();
  stop.record(stream);
  stop.synchronize();
  return static_cast<double>(start.elapsed_time(stop)) / kRuns;
}
#else
double time_on_cuda(const std::function<void()>&, const c10::Device&) { return NAN; }
#endif

// One warm-up run (allocations, oneDNN's primitive cache), then the median of 3 runs with a
// steady clock: the median, as other processes may share the cores.
double time_on_cpu(const std::function<void()>& run) {
  run();
  constexpr int kRuns = 3;
  std::array<double, kRuns> ms{};
  for (double& t : ms) {
    const auto start = std::chrono::steady_clock::now();
    run();
    t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  std::sort(ms.begin(), ms.end());
  return ms[kRuns / 2];
}

// The default timer: CUDA events on CUDA devices, the steady clock on the CPU, NaN elsewhere.
double time_on_device(const std::function<void()>& run, const c10::Device& device) {
  return device.is_cpu() ? time_on_cpu(run) : time_on_cuda(run, device);
}

// Whether `config` holds anything resolve_ns_config resolves.
bool unresolved(const NSConfig& config) {
  return config.compute_dtype == kNSDtypeAuto || config.form == NSForm::Default;
}

struct AutoDecisions {
  std::mutex mutex;
  std::vector<NSFormChoice> kept;  // in the order made
  NSFormTimer timer;               // null: time_on_cuda
  bool timing = true;
};

AutoDecisions& decisions() {
  static AutoDecisions state;
  return state;
}

bool same_key(const NSFormChoice& a, const NSFormChoice& b) {
  return a.m == b.m && a.n == b.n && a.d == b.d && a.batch == b.batch && a.steps == b.steps &&
         a.restart == b.restart && a.schedule == b.schedule && a.dtype == b.dtype &&
         a.device == b.device;
}

// What every rank of a job calls `key`: the device's type without its index (ranks run on
// cuda:LOCAL_RANK).
std::string job_key(const NSFormChoice& key, const c10::Device& device) {
  std::ostringstream out;
  out << "ns_form/" << key.m << "x" << key.n << "/d" << key.d << "/batch" << key.batch << "/steps"
      << key.steps << "/restart" << key.restart << "/schedule" << key.schedule << "/" << key.dtype
      << "/" << c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  return out.str();
}

// The kept decision for `key`, or else one made now: `plain` and `gram` run the two candidates
// once each, `model` is the cost model's answer.
bool decide(NSFormChoice key, const c10::Device& device, const std::function<void()>& plain,
            const std::function<void()>& gram, bool model) {
  AutoDecisions& state = decisions();
  NSFormTimer timer;
  {
    const std::lock_guard<std::mutex> lock(state.mutex);
    for (const NSFormChoice& c : state.kept) {
      if (same_key(c, key)) return c.gram;
    }
    if (state.timing) timer = state.timer ? state.timer : NSFormTimer(time_on_device);
  }
  // Timed outside the lock (the candidates run newton_schulz themselves).
  key.plain_ms = timer ? timer(plain, device) : NAN;
  key.gram_ms = std::isnan(key.plain_ms) ? NAN : timer(gram, device);
  key.measured = !std::isnan(key.plain_ms) && !std::isnan(key.gram_ms);
  key.gram = key.measured ? key.gram_ms < (1.0 - kNSGramMargin) * key.plain_ms : model;
  // In a data-parallel job, the job's choice: the first one any rank made for this key, so that
  // replicated ranks, each timing on its own, still take one form (detail::agree; not a
  // collective, so a rank may decide alone, as the owner does in a sharded step). The times kept
  // below stay this rank's own.
  key.gram = detail::agree(job_key(key, device), key.gram) != 0;
#ifdef FOGO_WITH_CUDA
  // Inside a capture the model answers this call only: the next eager sight measures (in a job
  // whose ranks already agreed on the key, the agreed answer holds, here and then).
  if (!key.measured && device.is_cuda() && capturing(device)) return key.gram;
#endif
  const std::lock_guard<std::mutex> lock(state.mutex);
  for (const NSFormChoice& c : state.kept) {
    if (same_key(c, key)) return c.gram;  // another thread decided meanwhile: its answer holds
  }
  state.kept.push_back(key);
  return key.gram;
}

NSFormChoice key_of(const at::Tensor& B, int64_t d, const NSConfig& config, int64_t schedule_id) {
  NSFormChoice key;
  key.m = std::min(B.size(-2), B.size(-1));
  key.n = std::max(B.size(-2), B.size(-1));
  key.d = d;
  key.batch = B.dim() == 3 ? B.size(0) : 0;
  key.steps = config.steps;
  key.restart = config.gram_restart;
  key.schedule = schedule_id;
  key.dtype = config.compute_dtype;
  key.device = B.device().str();
  return key;
}

// The schedule in a key (0: constant coefficients): a hash of its rows, as any list may be given
// (ns_coefficient_schedule), and a row with c = 0 skips a product, which moves the timing.
int64_t schedule_key(const NSConfig& config) {
  if (config.schedule.empty()) return 0;
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the numbers' bits
  for (const auto& row : config.schedule) {
    for (const double x : row) {
      uint64_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      h = (h ^ bits) * 1099511628211ULL;
    }
  }
  return static_cast<int64_t>(h >> 1) | 1;  // positive, never 0
}

NSConfig with_form(NSConfig config, NSForm form) {
  config.form = form;
  return config;
}

bool use_gram(const at::Tensor& B, const NSConfig& config, int64_t m, int64_t n) {
  switch (config.form) {
    case NSForm::Plain:
      return false;
    case NSForm::Gram:
      return true;
    case NSForm::Auto: {
      const NSConfig plain = with_form(config, NSForm::Plain),
                     gram = with_form(config, NSForm::Gram);
      return decide(
          key_of(B, 0, config, schedule_key(config)), B.device(),
          [&] { (void)newton_schulz(B, plain); }, [&] { (void)newton_schulz(B, gram); },
          newton_schulz_gram_is_cheaper(m, n, config.steps, config.gram_restart));
    }
    case NSForm::Default:  // resolved before (resolve_ns_config)
      return false;
  }
  return false;
}

}  // namespace

NSForm resolve_ns_form(NSForm form, c10::ScalarType dtype, const c10::Device& device) {
  if (form != NSForm::Default) return form;
  return dtype == kNSDtypeAuto && ns_auto_dtype(device) == at::kFloat ? NSForm::Auto
                                                                      : NSForm::Plain;
}

NSConfig resolve_ns_config(NSConfig config, const c10::Device& device) {
  config.form = resolve_ns_form(config.form, config.compute_dtype, device);
  config.compute_dtype = resolve_ns_dtype(config.compute_dtype, device);
  return config;
}

std::vector<NSFormChoice> ns_form_choices() {
  const std::lock_guard<std::mutex> lock(decisions().mutex);
  return decisions().kept;
}

void clear_ns_form_choices() {
  const std::lock_guard<std::mutex> lock(decisions().mutex);
  decisions().kept.clear();
}

void set_ns_form_timer(NSFormTimer timer) {
  const std::lock_guard<std::mutex> lock(decisions().mutex);
  decisions().timer = std::move(timer);
}

void set_ns_form_timing(bool enabled) {
  const std::lock_guard<std::mutex> lock(decisions().mutex);
  decisions().timing = enabled;
}

bool newton_schulz_projected_auto(const at::Tensor& B, const at::Tensor& Pi,
                                  const NSConfig& config) {
  if (unresolved(config))
    return newton_schulz_projected_auto(B, Pi, resolve_ns_config(config, B.device()));
  const int64_t m = B.size(-2), n = B.size(-1), d = Pi.size(-1);
  return decide(
      key_of(B, d, config, schedule_key(config)), B.device(),
      [&] {
        (void)at::matmul(newton_schulz(B, with_form(config, NSForm::Plain)),
                         Pi.to(config.compute_dtype));
      },
      [&] { (void)newton_schulz_projected(B, Pi, config); },
      newton_schulz_projected_is_cheaper(m, n, d, config.steps, config.gram_restart));
}

at::Tensor newton_schulz(const at::Tensor& B, const NSConfig& config) {
  if (unresolved(config)) return newton_schulz(B, resolve_ns_config(config, B.device()));
  validate(config);
  TORCH_CHECK(B.dim() == 2 || B.dim() == 3,
              "newton_schulz: input must be [m, n] or [batch, m, n], got shape ", B.sizes());
  TORCH_CHECK(at::isFloatingType(B.scalar_type()),
              "newton_schulz: input must be real floating point, got ", B.scalar_type());
  const bool batched = B.dim() == 3;
  const bool tall = B.size(-2) > B.size(-1);

  at::Tensor X = B.to(config.compute_dtype);
  if (tall) X = X.transpose(-2, -1);
  if (use_gram(B, config, X.size(-2), X.size(-1))) {
    X = batched ? X : X.unsqueeze(0);
    const at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
    X = gram_chain(
        X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                               : norms + config.eps),
        config);
    X = batched ? X : X.squeeze(0);
    return tall ? X.transpose(-2, -1) : X;
  }

  // Frobenius normalisation bounds the spectral norm by 1, inside NS's basin.
  if (batched) {
    at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
    X = X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                               : norms + config.eps);
  } else {
    // In place on a fresh copy, as torch.optim.Muon does (keeps its rounding).
    if (X.is_alias_of(B)) X = X.clone();
    at::Tensor norm = X.norm();
    X.div_(config.normalization == NSNormalization::ClampMin ? norm.clamp_min(config.eps)
                                                             : norm + config.eps);
  }

  for (int64_t k = 0; k < config.steps; ++k) {
    const auto [a, b, c] = config.at(k);
    if (batched) {
      at::Tensor A = at::bmm(X, X.transpose(-2, -1));
      at::Tensor poly = c == 0.0 ? A * b : at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      X = at::baddbmm(X, poly, X, /*beta=*/a, /*alpha=*/1.0);
    } else {
      at::Tensor A = at::mm(X, X.t());
      at::Tensor poly = c == 0.0 ? A * b : at::addmm(A, A, A, /*beta=*/b, /*alpha=*/c);
      X = at::addmm(X, poly, X, /*beta=*/a, /*alpha=*/1.0);
    }
  }
  return tall ? X.transpose(-2, -1) : X;
}

at::Tensor newton_schulz_projected(const at::Tensor& B, const at::Tensor& Pi,
                                   const NSConfig& config) {
  if (unresolved(config))
    return newton_schulz_projected(B, Pi, resolve_ns_config(config, B.device()));
  validate(config);
  TORCH_CHECK(B.dim() == 2 || B.dim() == 3,
              "newton_schulz_projected: input must be [m, n] or [batch, m, n], got shape ",
              B.sizes());
  TORCH_CHECK(at::isFloatingType(B.scalar_type()),
              "newton_schulz_projected: input must be real floating point, got ", B.scalar_type());
  TORCH_CHECK(B.size(-2) <= B.size(-1),
              "newton_schulz_projected: input must be wide (rows <= cols), got shape ", B.sizes());
  TORCH_CHECK(Pi.dim() == 2 && Pi.size(0) == B.size(-1),
              "newton_schulz_projected: Pi must be [n, d] with n = ", B.size(-1), ", got shape ",
              Pi.sizes());
  at::Tensor X = (B.dim() == 3 ? B : B.unsqueeze(0)).to(config.compute_dtype);
  const at::Tensor norms = at::linalg_vector_norm(X, 2, {-2, -1}, /*keepdim=*/true);
  X = X / (config.normalization == NSNormalization::ClampMin ? norms.clamp_min(config.eps)
                                                             : norms + config.eps);
  const at::Tensor Y = gram_chain(X, config, Pi.to(config.compute_dtype));
  return B.dim() == 3 ? Y : Y.squeeze(0);
}

double newton_schulz_macs(int64_t m, int64_t n, int64_t steps, bool gram, int64_t restart) {
  // Multiply-adds per matrix. Plain: each step X X^T (m^2 n), A^2 (m^3), polynomial times X
  // (m^2 n). Gram: A_0 and Q X_0 (m^2 n each); each step A^2 and F Q (m^3 each, the first F Q
  // free); between steps F A F (2 m^3), or at a restart Q X and X X^T (m^2 n each).
  if (steps == 0) return 0.0;
  const double M = static_cast<double>(m), N = static_cast<double>(n);
  const double K = static_cast<double>(steps);
  if (!gram) return K * (2 * M * M * N + M * M * M);
  const double restarts = restart > 0 ? static_cast<double>((steps - 1) / restart) : 0.0;
  return 2 * M * M * N + (2 * K - 1) * M * M * M + (K - 1 - restarts) * 2 * M * M * M +
         restarts * 2 * M * M * N;
}

bool newton_schulz_gram_is_cheaper(int64_t m, int64_t n, int64_t steps, int64_t restart) {
  return steps > 0 &&
         newton_schulz_macs(m, n, steps, true, restart) < newton_schulz_macs(m, n, steps, false, 0);
}

double newton_schulz_projected_macs(int64_t m, int64_t n, int64_t d, int64_t steps, bool gram,
                                    int64_t restart) {
  // Plain: the chain, then X Pi (m n d). Gram: the Gram form's count with its final Q X (m^2 n)
  // replaced by X Pi (m n d) and Q (X Pi) (m^2 d); without iterations just X0 Pi.
  const double M = static_cast<double>(m), N = static_cast<double>(n), D = static_cast<double>(d);
  const double project = M * N * D;
  if (!gram || steps == 0) return newton_schulz_macs(m, n, steps, false, 0) + project;
  return newton_schulz_macs(m, n, steps, true, restart) - M * M * N + project + M * M * D;
}

bool newton_schulz_projected_is_cheaper(int64_t m, int64_t n, int64_t d, int64_t steps,
                                        int64_t restart) {
  return steps > 0 && newton_schulz_projected_macs(m, n, d, steps, true, restart) <
                          newton_schulz_projected_macs(m, n, d, steps, false, 0);
}

}  // namespace fogo

// ns_dtype Auto's resolution (ns_dtype.h): per device, once per process.
#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "fogo/ns_dtype.h"
#include "fogo_private/frame/agreement.h"
#include "fogo_private/newton_schulz/dtype_record.h"

#ifdef FOGO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace fogo {

int64_t ns_dtype_code(c10::ScalarType dtype) {
  return dtype == kNSDtypeAuto ? -1 : static_cast<int64_t>(dtype);
}

c10::ScalarType ns_dtype_from_code(int64_t code) {
  return code == -1 ? kNSDtypeAuto : static_cast<c10::ScalarType>(code);
}

std::string ns_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case kNSDtypeAuto:
      return "auto";
    case c10::kBFloat16:
      return "bf16";
    case c10::kFloat:
      return "fp32";
    case c10::kDouble:
      return "fp64";
    case c10::kHalf:
      return "fp16";
    default:
      return c10::toString(dtype);
  }
}

namespace {

bool cpu_flag(const std::unordered_map<std::string, c10::IValue>& caps, const char* name) {
  const auto it = caps.find(name);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

// x86 CPUs compute bf16 GEMMs natively only with one of these; without them ATen converts and is
// several times slower than fp32 (issue 37: 6x on an AVX2 EPYC).
bool x86_without_bf16_units() {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto arch = caps.find("architecture");
  const bool x86 = arch != caps.end() && arch->second.isString() &&
                   (arch->second.toStringRef() == "x86_64" || arch->second.toStringRef() == "x86");
  return x86 && !cpu_flag(caps, "avx512_bf16") && !cpu_flag(caps, "amx_bf16") &&
         !cpu_flag(caps, "avx_ne_convert");
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// X X^T on [256, 1024] (a Newton–Schulz chain's first product at a mid-sized layer's shape) in
// bf16 and fp32: a warm-up each, then 5 runs each interleaved, so that load from other processes
// falls on both; the medians. The input is made without the global generator, which a user's
// seeded run must find untouched.
NSDtypeTimes measure_cpu_gemms() {
  if (x86_without_bf16_units()) {
    return {NAN, NAN, "no AVX512-BF16, AMX-BF16 or AVX-NE-CONVERT (cpuinfo): not measured"};
  }
  const at::Tensor x32 = at::sin(at::arange(256 * 1024, at::kFloat).reshape({256, 1024}) * 0.37);
  const at::Tensor x16 = x32.to(at::kBFloat16);
  const auto time = [](const at::Tensor& x) {
    const auto start = std::chrono::steady_clock::now();
    (void)at::mm(x, x.t());
    return ms_since(start);
  };
  (void)time(x32);
  (void)time(x16);
  constexpr int kRuns = 5;
  std::vector<double> t32, t16;
  for (int k = 0; k < kRuns; ++k) {
    t32.push_back(time(x32));
    t16.push_back(time(x16));
  }
  std::sort(t32.begin(), t32.end());
  std::sort(t16.begin(), t16.end());
  return {t16[kRuns / 2], t32[kRuns / 2], "measured"};
}

std::optional<c10::ScalarType> from_environment() {
  const char* value = std::getenv(kNSDtypeEnv);
  if (!value) return std::nullopt;
  const std::string v = value;
  if (v.empty() || v == "auto") return std::nullopt;
  if (v == "bf16" || v == "bfloat16") return c10::kBFloat16;
  if (v == "fp32" || v == "float32") return c10::kFloat;
  TORCH_CHECK_VALUE(false, "the environment variable ", kNSDtypeEnv,
                    " (ns_dtype auto's answer) must be bf16, fp32 or auto, got '", v, "'");
  return std::nullopt;
}

NSDtypeChoice decide_cuda(const c10::Device& device) {
  NSDtypeChoice c;
#ifdef FOGO_WITH_CUDA
  const auto* props = at::cuda::getDeviceProperties(device.index());
  const bool tensor_cores = props->major >= 8;
  c.dtype = tensor_cores ? c10::kBFloat16 : c10::kFloat;
  c.reason = "compute capability " + std::to_string(props->major) + "." +
             std::to_string(props->minor) +
             (tensor_cores ? " (bf16 tensor cores)" : " (no bf16 tensor cores)");
#else
  (void)device;
  c.dtype = c10::kFloat;
  c.reason = "fogo built without CUDA";
#endif
  return c;
}

struct AutoDtypeState {
  std::mutex mutex;
  std::vector<NSDtypeChoice> kept;
  NSDtypeProbe probe;                     // null: measure_cpu_gemms
  c10::ScalarType forced = kNSDtypeAuto;  // set_ns_auto_dtype's
};

AutoDtypeState& auto_dtype_state() {
  static AutoDtypeState state;
  return state;
}

// A device's key: "cuda" (the current device) is named by its index.
c10::Device concrete(c10::Device device) {
#ifdef FOGO_WITH_CUDA
  if (device.is_cuda() && !device.has_index()) {
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(at::cuda::current_device()));
  }
#endif
  return device;
}

// A decision for `device` (no lock held: the CPU's measurement runs ATen ops).
NSDtypeChoice decide(const c10::Device& device, c10::ScalarType forced, const NSDtypeProbe& probe) {
  NSDtypeChoice c;
  if (forced != kNSDtypeAuto) {
    c.dtype = forced;
    c.reason = "set_ns_auto_dtype";
  } else if (const auto env = from_environment()) {
    c.dtype = *env;
    c.reason = std::string(kNSDtypeEnv) + "=" + ns_dtype_name(*env);
  } else if (device.is_cuda()) {
    c = decide_cuda(device);
  } else if (device.is_cpu()) {
    const NSDtypeTimes t = probe ? probe() : measure_cpu_gemms();
    c.bf16_ms = t.bf16_ms;
    c.fp32_ms = t.fp32_ms;
    const bool faster = std::isfinite(t.bf16_ms) && std::isfinite(t.fp32_ms) &&
                        t.bf16_ms * kNSBf16Margin < t.fp32_ms;
    c.dtype = faster ? c10::kBFloat16 : c10::kFloat;
    c.reason = t.reason;
  } else {
    c.dtype = c10::kFloat;
    c.reason = "no bf16 rule for this device type";
  }
  c.device = device.str();
  if (device.is_cpu()) c.isa = cpu_isa();
  return c;
}

}  // namespace

c10::ScalarType ns_auto_dtype(const c10::Device& where) {
  const c10::Device device = concrete(where);
  const std::string key = device.str();
  AutoDtypeState& state = auto_dtype_state();
  c10::ScalarType forced;
  NSDtypeProbe probe;
  {
    const std::lock_guard<std::mutex> lock(state.mutex);
    for (const NSDtypeChoice& c : state.kept) {
      if (c.device == key) return c.dtype;
    }
    forced = state.forced;
    probe = state.probe;
  }
  NSDtypeChoice choice = decide(device, forced, probe);
  // A data-parallel job computes in one dtype on every rank, or replicated ranks drift apart by
  // rounding: the first answer any rank of the job gave for this device type is everyone's
  // (fogo_private/frame/agreement.h; without a job, this process's own).
  const int64_t own = ns_dtype_code(choice.dtype);
  const int64_t agreed = detail::agree("ns_dtype/" + c10::DeviceTypeName(device.type(), true), own);
  if (agreed != own) {
    choice.dtype = ns_dtype_from_code(agreed);
    choice.reason += "; the job's answer (another rank's): " + ns_dtype_name(choice.dtype);
  }
  const std::lock_guard<std::mutex> lock(state.mutex);
  for (const NSDtypeChoice& c : state.kept) {
    if (c.device == key) return c.dtype;  // another thread decided meanwhile: its answer holds
  }
  state.kept.push_back(std::move(choice));
  return state.kept.back().dtype;
}

std::vector<NSDtypeChoice> ns_dtype_choices() {
  const std::lock_guard<std::mutex> lock(auto_dtype_state().mutex);
  return auto_dtype_state().kept;
}

void set_ns_auto_dtype(c10::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == kNSDtypeAuto || dtype == c10::kBFloat16 || dtype == c10::kFloat,
                    "set_ns_auto_dtype: the dtype must be kBFloat16, kFloat or kNSDtypeAuto, got ",
                    ns_dtype_name(dtype));
  const std::lock_guard<std::mutex> lock(auto_dtype_state().mutex);
  auto_dtype_state().forced = dtype;
  auto_dtype_state().kept.clear();
}

void clear_ns_dtype_choices() {
  const std::lock_guard<std::mutex> lock(auto_dtype_state().mutex);
  auto_dtype_state().kept.clear();
}

void set_ns_dtype_probe(NSDtypeProbe probe) {
  const std::lock_guard<std::mutex> lock(auto_dtype_state().mutex);
  auto_dtype_state().probe = std::move(probe);
}

std::string cpu_isa() {
  const auto caps = at::cpu::get_cpu_capabilities();
  std::string out = at::get_cpu_capability();
  for (const auto& [flag, name] :
       {std::pair<const char*, const char*>{"avx512_bf16", "AVX512-BF16"},
        {"amx_bf16", "AMX-BF16"},
        {"avx_ne_convert", "AVX-NE-CONVERT"}}) {
    if (cpu_flag(caps, flag)) out += std::string(" +") + name;
  }
  for (const char* limit :
       {"ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"}) {
    if (const char* v = std::getenv(limit); v && *v) out += std::string(", ") + limit + "=" + v;
  }
  return out;
}

namespace detail {

void write_ns_dtypes(torch::serialize::OutputArchive& archive, const char* key,
                     const GroupNSDtypes& groups) {
  std::string text;
  for (const auto& [dtype, device] : groups) {
    text += (text.empty() ? "" : ",") + ns_dtype_name(resolve_ns_dtype(dtype, device));
  }
  archive.write(key, c10::IValue(text));
}

void warn_on_changed_ns_dtypes(torch::serialize::InputArchive& archive, const char* key,
                               const char* optimizer, const GroupNSDtypes& groups) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isString()) return;
  std::istringstream recorded(value.toStringRef());
  std::string then;
  for (size_t g = 0; g < groups.size() && std::getline(recorded, then, ','); ++g) {
    const auto& [dtype, device] = groups[g];
    if (dtype != kNSDtypeAuto) continue;
    const std::string now = ns_dtype_name(ns_auto_dtype(device));
    if (now == then) continue;
    TORCH_WARN(optimizer, "::load: group ", g, "'s Newton–Schulz computed in ", then,
               " where the checkpoint was written (ns_dtype auto); auto resolves to ", now,
               " here, so the run continues in ", now,
               " (the same steps, rounded differently; set ns_dtype or ", kNSDtypeEnv, " to ", then,
               " to keep the checkpoint's arithmetic)");
  }
}

}  // namespace detail
}  // namespace fogo

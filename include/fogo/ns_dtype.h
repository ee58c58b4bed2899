#pragma once
// ns_dtype Auto, the optimizers' default: the dtype Newton–Schulz computes in, chosen by the
// hardware (issue 37). bf16 GEMMs are several times faster than fp32 ones on GPUs with bf16
// tensor cores and on CPUs with bf16 units (AVX512-BF16, AMX), and several times slower on CPUs
// without them (AVX2-only hosts, AVX-512 without BF16), where ATen emulates them.
//
// Auto resolves once per device and process, at the first step (or the first newton_schulz call)
// that meets it there:
//  - FOGO_NS_DTYPE=bf16 or fp32 in the environment, or set_ns_auto_dtype(), fix the answer
//    everywhere (reproducibility; the distributed layer makes rank 0's choice everyone's);
//  - on a CUDA device: bf16 when it has bf16 tensor cores (compute capability >= 8.0), else fp32;
//  - on the CPU: bf16 only when a measured bf16 GEMM is kNSBf16Margin times faster than the same
//    fp32 GEMM (a [256, 1024] X X^T, a warm-up and 5 runs each, interleaved, medians; a few ms
//    where bf16 is fast). An x86 CPU without AVX512-BF16, AMX-BF16 or AVX-NE-CONVERT (cpuinfo)
//    takes fp32 without measuring.
// The choices are listed by ns_dtype_choices(). Explicit kBFloat16 or kFloat is never touched:
// ns_dtype(kBFloat16) is torch.optim.Muon's arithmetic, bit for bit.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fogo {

/// The ns_dtype value "auto" (c10's Undefined). Checkpoints and checksums hold ns_dtype_code(),
/// never the enumerator's number, which moves when LibTorch adds dtypes.
inline constexpr c10::ScalarType kNSDtypeAuto = c10::ScalarType::Undefined;

/// bf16 is taken on the CPU when its GEMM is at least this many times faster than fp32's: hosts
/// where the two are close keep fp32 (the precise one) and do not flip between runs with noise.
inline constexpr double kNSBf16Margin = 1.25;

/// The environment variable that fixes Auto's answer: bf16, fp32, or auto / empty (measure).
inline constexpr const char* kNSDtypeEnv = "FOGO_NS_DTYPE";

/// An ns_dtype as checkpoints and checksums hold it: the ScalarType's number (bf16 15, fp32 6,
/// fp64 7), -1 for kNSDtypeAuto; ns_dtype_from_code is its inverse.
int64_t ns_dtype_code(c10::ScalarType dtype);
c10::ScalarType ns_dtype_from_code(int64_t code);
/// "auto", "bf16", "fp32", "fp64", "fp16", else c10's name.
std::string ns_dtype_name(c10::ScalarType dtype);

/// One resolution of Auto: where, the dtype taken and why.
struct NSDtypeChoice {
  std::string device;  ///< "cpu", "cuda:0"
  c10::ScalarType dtype = c10::kFloat;
  std::string reason;    ///< e.g. "measured", "compute capability 9.0", "FOGO_NS_DTYPE=fp32"
  std::string isa;       ///< the CPU's ISA (cpu_isa()); empty elsewhere
  double bf16_ms = NAN;  ///< the CPU measurement's GEMM times in ms (NaN when none ran)
  double fp32_ms = NAN;
};

/// What Auto computes in on `device` (decided at the first call there, kept after).
c10::ScalarType ns_auto_dtype(const c10::Device& device);
/// `dtype`, or for kNSDtypeAuto ns_auto_dtype(device): the dtype Newton–Schulz runs in.
inline c10::ScalarType resolve_ns_dtype(c10::ScalarType dtype, const c10::Device& device) {
  return dtype == kNSDtypeAuto ? ns_auto_dtype(device) : dtype;
}
/// Every resolution kept in this process, in the order made.
std::vector<NSDtypeChoice> ns_dtype_choices();
/// Fixes Auto's answer on every device for the rest of the process (kBFloat16 or kFloat; the
/// distributed layer gives every rank rank 0's choice), above FOGO_NS_DTYPE; kNSDtypeAuto
/// returns to the devices' own choices. Either way the kept resolutions are forgotten.
void set_ns_auto_dtype(c10::ScalarType dtype);
/// Forgets the kept resolutions: the next call on each device decides again.
void clear_ns_dtype_choices();

/// The CPU measurement: the times in ms of one bf16 and one fp32 GEMM (NaN: not measured, fp32
/// is taken) and a word on how they were had.
struct NSDtypeTimes {
  double bf16_ms = NAN, fp32_ms = NAN;
  std::string reason;
};
/// How Auto measures the CPU. The default (null) times ATen's GEMMs as described above; a test
/// injects its own. Null restores the default.
using NSDtypeProbe = std::function<NSDtypeTimes()>;
void set_ns_dtype_probe(NSDtypeProbe probe);

/// The CPU's instruction sets that matter for GEMMs, e.g. "AVX512 +AVX512-BF16 +AMX-BF16"
/// (ATen's CPU capability and cpuinfo's bf16 flags), with a note when ONEDNN_MAX_CPU_ISA or
/// MKL_ENABLE_INSTRUCTIONS limit oneDNN or MKL below what cpuinfo reports.
std::string cpu_isa();

}  // namespace fogo

#pragma once
// Helpers shared by fogo's tests.
#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace fogo::test {

/// Runs `f` and requires it to throw a c10::Error whose message contains `needle`.
inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

/// What decides how this CPU rounds a bf16 matmul: ATen's CPU capability (its kernels' ISA) and
/// the instructions oneDNN picks its bf16 GEMMs by (an AMX or AVX512-BF16 host accumulates in
/// another order than an AVX512F one). Bitwise references made on a machine with another
/// signature agree only to bf16 rounding. tests/reference/gen_muon_reference.py writes the same
/// string (keep the two in step).
inline std::string cpu_matmul_signature() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  std::string out = at::get_cpu_capability() + "|";
  const char* sep = "";
  for (const char* f : {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}) {
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) {
      out += sep;
      out += f;
      sep = ",";
    }
  }
  return out;
}

/// Every tensor equal bit for bit, shapes included (fp32 compared as integers: -0.0 and NaN
/// payloads count, and equal NaNs compare equal).
inline bool bit_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    const auto bits = [](const at::Tensor& t) {
      return t.scalar_type() == at::kFloat ? t.view(at::kInt) : t;
    };
    if (a[k].sizes() != b[k].sizes() || !at::equal(bits(a[k]), bits(b[k]))) return false;
  }
  return true;
}

}  // namespace fogo::test

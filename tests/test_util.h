#pragma once
// Helpers shared by fogo's tests.
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

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

}  // namespace fogo::test

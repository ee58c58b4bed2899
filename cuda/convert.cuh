#pragma once
// Element types of fogo's kernels: loads to fp32 and stores from it (round to nearest even, as
// ATen's conversions round), and the dispatch from FloatType to the element type.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fogo_private/cuda/kernels.h"

namespace fogo::cuda {

template <typename T>
struct Convert;
template <>
struct Convert<float> {
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Convert<__half> {
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};

// Calls f with a null pointer of the element type `type` names (its template argument).
template <typename F>
void with_type(FloatType type, F&& f) {
  switch (type) {
    case FloatType::Float:
      return f(static_cast<float*>(nullptr));
    case FloatType::BFloat16:
      return f(static_cast<__nv_bfloat16*>(nullptr));
    case FloatType::Half:
      return f(static_cast<__half*>(nullptr));
  }
}

// Calls f with null pointers of the element types `a` and `b` name.
template <typename F>
void with_types(FloatType a, FloatType b, F&& f) {
  with_type(a, [&](auto* a_tag) { with_type(b, [&](auto* b_tag) { f(a_tag, b_tag); }); });
}

}  // namespace fogo::cuda

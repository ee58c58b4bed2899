#pragma once
// Warp and block reductions shared by fogo's kernels. Every lane of the warp (every thread of the
// block) must call them: the row-wise kernels assign whole warps to rows, so early exits are
// warp-uniform.

#include <cuda_runtime.h>

#include <cstdint>

namespace fogo::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

/// Sum over the block, returned to every thread. `scratch` holds one T per warp; blockDim.x is a
/// multiple of 32 and at most 1024. The summation order is fixed by the launch shape, so results
/// are deterministic.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < warps ? scratch[lane] : T(0);
  return warp_sum(total);
}

/// Rows of the row-wise kernels: warp w of block b owns row b * rows_per_block + w.
__device__ __forceinline__ int64_t warp_row(int rows_per_block) {
  return static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32;
}

}  // namespace fogo::cuda

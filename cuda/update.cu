// The RMS-scaled update with decoupled weight decay (ALGORITHM.md step 9; paper "Projection Back
// to Original Space and Parameter Update"), in two kernels: the norms |Ohat|_F, |delta|_F, |O_s|_F
// reduced into per-block partials, then one pass that forms Ohat = O_s + delta again, scales it
// and writes the parameter. The step size depends on a norm over the whole matrix, so the two
// passes cannot be one; the partials are re-reduced by every block of the second pass in a fixed
// order (deterministic, no atomics, nothing to zero first).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "convert.cuh"
#include "kernels.h"
#include "reduce.cuh"

namespace fogo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 128;
constexpr int kTile = 32;  // the transposed write goes through a kTile x kTile shared tile
constexpr int kMaxTileBlocks = 1024;

template <typename TO>
__global__ void __launch_bounds__(kThreads)
    rms_norms_kernel(const TO* __restrict__ Os, const float* __restrict__ delta, int64_t numel,
                     double* __restrict__ partials) {
  __shared__ double scratch[32];
  double hat = 0.0, dd = 0.0, oo = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < numel;
       k += stride) {
    const float o = Convert<TO>::load(Os[k]), dl = delta[k];
    const float h = o + dl;  // Ohat rounded to fp32, as the reference materialises it
    hat += static_cast<double>(h) * h;
    dd += static_cast<double>(dl) * dl;
    oo += static_cast<double>(o) * o;
  }
  hat = block_sum(hat, scratch);
  dd = block_sum(dd, scratch);
  oo = block_sum(oo, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = hat;
    partials[gridDim.x + blockIdx.x] = dd;
    partials[2 * gridDim.x + blockIdx.x] = oo;
  }
}

template <typename T, typename TO>
__global__ void __launch_bounds__(kThreads)
    rms_apply_kernel(T* __restrict__ param, const TO* __restrict__ Os,
                     const float* __restrict__ delta, int64_t m, int64_t n, bool transposed,
                     const double* __restrict__ partials, int blocks, UpdateArgs args,
                     float* __restrict__ ratio) {
  __shared__ double scratch[32];
  __shared__ float tile[kTile][kTile + 1];  // +1: conflict-free column reads
  double hat = 0.0, dd = 0.0, oo = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    hat += partials[b];
    dd += partials[blocks + b];
    oo += partials[2 * blocks + b];
  }
  hat = block_sum(hat, scratch);
  dd = block_sum(dd, scratch);
  oo = block_sum(oo, scratch);
  const float eps = static_cast<float>(args.eps);
  const double lr = args.device_lr != nullptr ? *args.device_lr : args.lr;
  // lr gamma_t = lr sigma sqrt(mn) / (|Ohat|_F + eps); the arithmetic below is fp32 with each
  // product and difference rounded as the reference's separate ATen ops round them.
  const float step = static_cast<float>(lr * args.sigma * std::sqrt(static_cast<double>(m * n))) /
                     (static_cast<float>(std::sqrt(hat)) + eps);
  const float decay = static_cast<float>(1.0 - lr * args.weight_decay);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    ratio[0] = static_cast<float>(std::sqrt(dd)) / (static_cast<float>(std::sqrt(oo)) + eps);

  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const auto apply = [&](T& p, float ohat) {
    p = Convert<T>::store(__fsub_rn(__fmul_rn(Convert<T>::load(p), decay), __fmul_rn(ohat, step)));
  };
  for (int64_t t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
    const int64_t r0 = (t / tiles_n) * kTile, c0 = (t % tiles_n) * kTile;
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      const int64_t r = r0 + y, c = c0 + tx;
      if (r < m && c < n)
        tile[y][tx] = __fadd_rn(Convert<TO>::load(Os[r * n + c]), delta[r * n + c]);
    }
    __syncthreads();
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      if (!transposed) {  // param [m, n]: same layout as the working orientation
        const int64_t r = r0 + y, c = c0 + tx;
        if (r < m && c < n) apply(param[r * n + c], tile[y][tx]);
      } else {  // param [n, m] = Ohat^T, written along its rows for coalescing
        const int64_t r = r0 + tx, c = c0 + y;
        if (r < m && c < n) apply(param[c * m + r], tile[tx][y]);
      }
    }
    __syncthreads();  // the tile is refilled next round
  }
}

}  // namespace

int rms_partial_blocks(int64_t numel) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * 16;
  return static_cast<int>(
      std::clamp<int64_t>((numel + per_block - 1) / per_block, 1, kMaxPartials));
}

void launch_rms_norms(const void* Os, FloatType os_type, const float* delta, int64_t numel,
                      double* partials, cudaStream_t stream) {
  with_type(os_type, [&](auto* os_tag) {
    using TO = std::remove_pointer_t<decltype(os_tag)>;
    rms_norms_kernel<TO><<<rms_partial_blocks(numel), kThreads, 0, stream>>>(
        static_cast<const TO*>(Os), delta, numel, partials);
  });
}

void launch_rms_apply(void* param, FloatType param_type, const void* Os, FloatType os_type,
                      const float* delta, int64_t m, int64_t n, bool transposed,
                      const double* partials, UpdateArgs args, float* ratio, cudaStream_t stream) {
  const int64_t tiles = ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, kMaxTileBlocks));
  with_type(param_type, [&](auto* param_tag) {
    with_type(os_type, [&](auto* os_tag) {
      using T = std::remove_pointer_t<decltype(param_tag)>;
      using TO = std::remove_pointer_t<decltype(os_tag)>;
      rms_apply_kernel<T, TO><<<grid, kThreads, 0, stream>>>(
          static_cast<T*>(param), static_cast<const TO*>(Os), delta, m, n, transposed, partials,
          rms_partial_blocks(m * n), args, ratio);
    });
  });
}

}  // namespace fogo::cuda

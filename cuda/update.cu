// The RMS-scaled update with decoupled weight decay (docs/algorithm.md step 9; paper "Projection
// Back to Original Space and Parameter Update") for all parameters of a group at once (multi-tensor
// launches: their table is a kernel argument), in three kernels: the norms |Ohat|_F, |delta|_F,
// |O_s|_F reduced into per-block partials, each parameter's step size from its partials (one
// block each, a fixed order: deterministic, no atomics, nothing to zero first), then one pass
// that forms Ohat = O_s + delta again, scales it and writes the parameters. The step size depends
// on a norm over the whole matrix, so the passes cannot be one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "convert.cuh"
#include "fogo_private/cuda/kernels.h"
#include "multi_tensor.cuh"
#include "reduce.cuh"

namespace fogo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 128;
constexpr int kTile = 32;  // the transposed write goes through a kTile x kTile shared tile
constexpr int kMaxTileBlocks = 2048;

// Where each parameter of a chunk starts in the launches' flattened index spaces: its norm
// blocks (and its 3 x blocks partials) and its tiles. blocks[count], tiles[count]: the totals.
struct RmsLayout {
  int64_t blocks[kRmsChunk + 1];
  int64_t tiles[kRmsChunk + 1];
};

int64_t partial_blocks(int64_t numel) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * 16;
  return std::clamp<int64_t>((numel + per_block - 1) / per_block, 1, kMaxPartials);
}

int64_t tiles_of(const RmsTensor& t) {
  return ((t.m + kTile - 1) / kTile) * ((t.n + kTile - 1) / kTile);
}

RmsLayout layout_of(const RmsChunk& chunk) {
  RmsLayout l{};
  for (int k = 0; k < chunk.count; ++k) {
    l.blocks[k + 1] = l.blocks[k] + partial_blocks(chunk.t[k].m * chunk.t[k].n);
    l.tiles[k + 1] = l.tiles[k] + tiles_of(chunk.t[k]);
  }
  return l;
}

// Pass 1: per block, sum (Os+delta)^2, sum delta^2, sum Os^2 of one parameter's elements (its
// blocks stride over them) into partials [3, blocks] at 3 x its first block.
template <typename TO>
__global__ void __launch_bounds__(kThreads)
    rms_norms_kernel(const __grid_constant__ RmsChunk chunk,
                     const __grid_constant__ RmsLayout layout, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int k = owner(layout.blocks, chunk.count, blockIdx.x);
  const RmsTensor& t = chunk.t[k];
  const int64_t first = layout.blocks[k], blocks = layout.blocks[k + 1] - first;
  const int64_t block = blockIdx.x - first, numel = t.m * t.n, stride = blocks * kThreads;
  const TO* __restrict__ Os = static_cast<const TO*>(t.Os);
  double hat = 0.0, dd = 0.0, oo = 0.0;
  for (int64_t i = block * kThreads + threadIdx.x; i < numel; i += stride) {
    const float o = Convert<TO>::load(Os[i]), dl = t.delta[i];
    const float h = o + dl;  // Ohat rounded to fp32, as the reference materialises it
    hat += static_cast<double>(h) * h;
    dd += static_cast<double>(dl) * dl;
    oo += static_cast<double>(o) * o;
  }
  hat = block_sum(hat, scratch);
  dd = block_sum(dd, scratch);
  oo = block_sum(oo, scratch);
  if (threadIdx.x == 0) {
    double* out = partials + 3 * first;
    out[block] = hat;
    out[blocks + block] = dd;
    out[2 * blocks + block] = oo;
  }
}

// Pass 2, one block per parameter: its partials re-reduced in a fixed order (deterministic, no
// atomics), then lr gamma_t into steps[k] and the ratio into ratio[k].
__global__ void __launch_bounds__(kThreads)
    rms_scale_kernel(const __grid_constant__ RmsChunk chunk,
                     const __grid_constant__ RmsLayout layout, const double* __restrict__ partials,
                     UpdateArgs args, float* __restrict__ steps, float* __restrict__ ratio) {
  __shared__ double scratch[32];
  const int k = blockIdx.x;
  const int64_t first = layout.blocks[k], blocks = layout.blocks[k + 1] - first;
  const double* in = partials + 3 * first;
  double hat = 0.0, dd = 0.0, oo = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    hat += in[b];
    dd += in[blocks + b];
    oo += in[2 * blocks + b];
  }
  hat = block_sum(hat, scratch);
  dd = block_sum(dd, scratch);
  oo = block_sum(oo, scratch);
  if (threadIdx.x != 0) return;
  const float eps = static_cast<float>(args.eps);
  const double lr = args.device_lr != nullptr ? *args.device_lr : args.lr;
  const double mn = static_cast<double>(chunk.t[k].m * chunk.t[k].n);
  // lr gamma_t = lr sigma sqrt(mn) / (|Ohat|_F + eps): the numerator in double rounded once, the
  // quotient in fp32, as the reference's ATen ops round them.
  steps[k] = static_cast<float>(lr * args.sigma * std::sqrt(mn)) /
             (static_cast<float>(std::sqrt(hat)) + eps);
  ratio[k] = static_cast<float>(std::sqrt(dd)) / (static_cast<float>(std::sqrt(oo)) + eps);
}

// Pass 3: every tile of every parameter (blocks stride over the chunk's tiles),
// p' = fl(fl(p decay) - fl(Ohat step)) in fp32, one rounding to the parameter's type.
template <typename T, typename TO>
__global__ void __launch_bounds__(kThreads)
    rms_apply_kernel(const __grid_constant__ RmsChunk chunk,
                     const __grid_constant__ RmsLayout layout, UpdateArgs args,
                     const float* __restrict__ steps) {
  __shared__ float tile[kTile][kTile + 1];      // +1: conflict-free column reads
  if (args.ok != nullptr && !*args.ok) return;  // Mask: the parameters keep every bit
  const double lr = args.device_lr != nullptr ? *args.device_lr : args.lr;
  const float decay = static_cast<float>(1.0 - lr * args.weight_decay);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  for (int64_t g = blockIdx.x; g < layout.tiles[chunk.count]; g += gridDim.x) {
    const int k = owner(layout.tiles, chunk.count, g);
    const RmsTensor& t = chunk.t[k];
    const int64_t m = t.m, n = t.n, tiles_n = (n + kTile - 1) / kTile;
    const int64_t local = g - layout.tiles[k];
    const int64_t r0 = (local / tiles_n) * kTile, c0 = (local % tiles_n) * kTile;
    const TO* __restrict__ Os = static_cast<const TO*>(t.Os);
    T* __restrict__ param = static_cast<T*>(t.param);
    const float step = steps[k];
    const auto apply = [&](T& p, float ohat) {
      p = Convert<T>::store(
          __fsub_rn(__fmul_rn(Convert<T>::load(p), decay), __fmul_rn(ohat, step)));
    };
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      const int64_t r = r0 + y, c = c0 + tx;
      if (r < m && c < n)
        tile[y][tx] = __fadd_rn(Convert<TO>::load(Os[r * n + c]), t.delta[r * n + c]);
    }
    __syncthreads();
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      if (!t.transposed) {  // param [m, n]: same layout as the working orientation
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

// fogo::Muon's update, every tile of every parameter: p1 = fl_T(p decay), then
// p = fl_T(fma(alpha, O, p1)), as mul_ and add_(O, alpha) round it (ATen's add is
// self + alpha * other in fp32, contracted to one fma). A transposed O goes through a shared tile
// so that O and the parameter are both read along their rows.
template <typename T, typename TO>
__global__ void __launch_bounds__(kThreads)
    muon_update_kernel(const __grid_constant__ MuonChunk chunk,
                       const __grid_constant__ TileLayout<kMuonChunk> layout, MuonArgs args) {
  __shared__ float tile[kTile][kTile + 1];      // +1: conflict-free column reads
  if (args.ok != nullptr && !*args.ok) return;  // Mask: the parameters keep every bit
  const double lr = args.device_lr != nullptr ? *args.device_lr : args.lr;
  // The host's double arithmetic, uncontracted, then one rounding to fp32 as ATen's scalars.
  const float decay = static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, args.weight_decay)));
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  for (int64_t g = blockIdx.x; g < layout.tiles[chunk.count]; g += gridDim.x) {
    const auto [k, r0, c0] = tile_origin<kTile>(chunk, layout.tiles, g);  // block-uniform
    const MuonTensor& t = chunk.t[k];
    const int64_t rows = t.rows, cols = t.cols;
    const float alpha = static_cast<float>(-__dmul_rn(__dmul_rn(lr, t.f1), t.f2));
    const TO* __restrict__ O = static_cast<const TO*>(t.O);
    T* __restrict__ param = static_cast<T*>(t.param);
    const auto apply = [&](T& p, float o) {
      const float p1 = Convert<T>::load(Convert<T>::store(__fmul_rn(Convert<T>::load(p), decay)));
      p = Convert<T>::store(__fmaf_rn(alpha, o, p1));
    };
    if (!t.transposed) {  // O [rows, cols]: the parameter's layout
      for (int y = ty; y < kTile; y += kThreads / kTile) {
        const int64_t r = r0 + y, c = c0 + tx;
        if (r < rows && c < cols) apply(param[r * cols + c], Convert<TO>::load(O[r * cols + c]));
      }
      continue;  // uniform over the block
    }
    for (int y = ty; y < kTile; y += kThreads / kTile) {  // O [cols, rows], read along its rows
      const int64_t c = c0 + y, r = r0 + tx;
      if (r < rows && c < cols) tile[y][tx] = Convert<TO>::load(O[c * rows + r]);
    }
    __syncthreads();
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      const int64_t r = r0 + y, c = c0 + tx;
      if (r < rows && c < cols) apply(param[r * cols + c], tile[tx][y]);
    }
    __syncthreads();  // the tile is refilled next round
  }
}

}  // namespace

void launch_muon_update(const MuonChunk& chunk, FloatType param_type, FloatType o_type,
                        MuonArgs args, cudaStream_t stream) {
  const auto layout = tile_layout<kTile>(chunk);
  if (layout.tiles[chunk.count] == 0) return;  // nothing to write
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(layout.tiles[chunk.count], kMaxTileBlocks));
  with_types(param_type, o_type, [&](auto* param_tag, auto* o_tag) {
    using T = std::remove_pointer_t<decltype(param_tag)>;
    using TO = std::remove_pointer_t<decltype(o_tag)>;
    muon_update_kernel<T, TO><<<grid, kThreads, 0, stream>>>(chunk, layout, args);
  });
}

int64_t rms_scratch_doubles(const RmsChunk& chunk) {
  // 3 partials per norm block, then one step size per parameter (an fp32 in a double's slot).
  return 3 * layout_of(chunk).blocks[chunk.count] + chunk.count;
}

void launch_rms_update(const RmsChunk& chunk, FloatType param_type, FloatType os_type,
                       UpdateArgs args, double* scratch, float* ratio, cudaStream_t stream) {
  if (chunk.count == 0) return;
  const RmsLayout layout = layout_of(chunk);
  double* partials = scratch;
  float* steps = reinterpret_cast<float*>(scratch + 3 * layout.blocks[chunk.count]);
  with_type(os_type, [&](auto* os_tag) {
    using TO = std::remove_pointer_t<decltype(os_tag)>;
    rms_norms_kernel<TO>
        <<<static_cast<unsigned>(layout.blocks[chunk.count]), kThreads, 0, stream>>>(chunk, layout,
                                                                                     partials);
  });
  rms_scale_kernel<<<chunk.count, kThreads, 0, stream>>>(chunk, layout, partials, args, steps,
                                                         ratio);
  // Parameters without elements have no tiles: nothing to write (and a zero-block grid is a
  // launch error).
  if (layout.tiles[chunk.count] == 0) return;
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(layout.tiles[chunk.count], kMaxTileBlocks));
  with_types(param_type, os_type, [&](auto* param_tag, auto* os_tag) {
    using T = std::remove_pointer_t<decltype(param_tag)>;
    using TO = std::remove_pointer_t<decltype(os_tag)>;
    rms_apply_kernel<T, TO><<<grid, kThreads, 0, stream>>>(chunk, layout, args, steps);
  });
}

}  // namespace fogo::cuda

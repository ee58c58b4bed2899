// Step 1 and the Newton–Schulz inputs of step 2 in one pass (docs/algorithm.md step 1; momenta.h):
// the ATen route reads G twice and each momentum twice (update, then the cast-and-copy into the
// NS input); this kernel reads each once. A transposed input goes through a shared tile so that
// both the momenta and the input are accessed along their rows. All parameters of a group go
// through one launch per kMomentaChunk (their table is a kernel argument): blocks stride over
// the chunk's tiles, parameter after parameter.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "convert.cuh"
#include "fogo_private/cuda/kernels.h"
#include "multi_tensor.cuh"

namespace fogo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kMaxBlocks = 4096;

using MomentaLayout = TileLayout<kMomentaChunk>;

template <typename TX>
__global__ void __launch_bounds__(kThreads)
    momenta_kernel(const __grid_constant__ MomentaChunk chunk,
                   const __grid_constant__ MomentaLayout layout, float mu_s, float mu_f,
                   const bool* ok) {
  __shared__ float tile_s[kTile][kTile + 1], tile_f[kTile][kTile + 1];  // +1: no bank conflicts
  const bool take = ok == nullptr || *ok;
  // As the ATen route rounds: fl(B mu) then fl(. + G); a masked step multiplies by 1 and adds
  // -0, keeping every bit (and never reads G, which may hold NaN).
  const float ms = take ? mu_s : 1.0f, mf = take ? mu_f : 1.0f;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  for (int64_t g = blockIdx.x; g < layout.tiles[chunk.count]; g += gridDim.x) {
    const auto [k, r0, c0] = tile_origin<kTile>(chunk, layout.tiles, g);  // block-uniform
    const MomentaTensor& t = chunk.t[k];
    const int64_t rows = t.rows, cols = t.cols;
    float* __restrict__ Bs = t.Bs;
    float* __restrict__ Bf = t.Bf;
    const float* __restrict__ G = t.G;
    TX* __restrict__ Xs = static_cast<TX*>(t.Xs);
    TX* __restrict__ Xf = static_cast<TX*>(t.Xf);
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      const int64_t r = r0 + y, c = c0 + tx;
      if (r >= rows || c >= cols) continue;
      const int64_t i = r * cols + c;
      const float grad = take ? G[i] : -0.0f;
      const float s = __fadd_rn(__fmul_rn(Bs[i], ms), grad);
      const float f = __fadd_rn(__fmul_rn(Bf[i], mf), grad);
      Bs[i] = s;
      Bf[i] = f;
      if (!t.transposed) {
        if (Xs != nullptr) Xs[i] = Convert<TX>::store(s);
        if (Xf != nullptr) Xf[i] = Convert<TX>::store(f);
      } else {
        tile_s[y][tx] = s;
        tile_f[y][tx] = f;
      }
    }
    if (t.transposed) {  // uniform over the block
      __syncthreads();
      for (int y = ty; y < kTile; y += kThreads / kTile) {
        const int64_t r = r0 + tx, c = c0 + y;  // X [cols, rows]: X[c][r] = B[r][c]
        if (r >= rows || c >= cols) continue;
        if (Xs != nullptr) Xs[c * rows + r] = Convert<TX>::store(tile_s[tx][y]);
        if (Xf != nullptr) Xf[c * rows + r] = Convert<TX>::store(tile_f[tx][y]);
      }
      __syncthreads();  // the tiles are refilled next round
    }
  }
}

}  // namespace

void launch_momenta(const MomentaChunk& chunk, float mu_s, float mu_f, const bool* ok,
                    FloatType x_type, cudaStream_t stream) {
  const MomentaLayout layout = tile_layout<kTile>(chunk);
  const int64_t tiles = layout.tiles[chunk.count];
  if (tiles == 0) return;  // no parameter (a zero-block grid is a launch error)
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, kMaxBlocks));
  with_type(x_type, [&](auto* tag) {
    using TX = std::remove_pointer_t<decltype(tag)>;
    momenta_kernel<TX><<<grid, kThreads, 0, stream>>>(chunk, layout, mu_s, mu_f, ok);
  });
}

}  // namespace fogo::cuda

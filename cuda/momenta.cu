// Step 1 and the Newton–Schulz inputs of step 2 in one pass (ALGORITHM.md step 1; momenta.h):
// the ATen route reads G twice and each momentum twice (update, then the cast-and-copy into the
// NS input); this kernel reads each once. A transposed input goes through a shared tile so that
// both the momenta and the input are accessed along their rows.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "convert.cuh"
#include "kernels.h"

namespace fogo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kMaxBlocks = 4096;

template <typename TX>
__global__ void __launch_bounds__(kThreads)
    momenta_kernel(float* __restrict__ Bs, float* __restrict__ Bf, const float* __restrict__ G,
                   int64_t rows, int64_t cols, float mu_s, float mu_f, const bool* ok,
                   TX* __restrict__ Xs, TX* __restrict__ Xf, bool transposed) {
  __shared__ float tile_s[kTile][kTile + 1], tile_f[kTile][kTile + 1];  // +1: no bank conflicts
  const bool take = ok == nullptr || *ok;
  // As the ATen route rounds: fl(B mu) then fl(. + G); a masked step multiplies by 1 and adds
  // -0, keeping every bit (and never reads G, which may hold NaN).
  const float ms = take ? mu_s : 1.0f, mf = take ? mu_f : 1.0f;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_r * tiles_c; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    for (int y = ty; y < kTile; y += kThreads / kTile) {
      const int64_t r = r0 + y, c = c0 + tx;
      if (r >= rows || c >= cols) continue;
      const int64_t k = r * cols + c;
      const float g = take ? G[k] : -0.0f;
      const float s = __fadd_rn(__fmul_rn(Bs[k], ms), g);
      const float f = __fadd_rn(__fmul_rn(Bf[k], mf), g);
      Bs[k] = s;
      Bf[k] = f;
      if (!transposed) {
        if (Xs != nullptr) Xs[k] = Convert<TX>::store(s);
        if (Xf != nullptr) Xf[k] = Convert<TX>::store(f);
      } else {
        tile_s[y][tx] = s;
        tile_f[y][tx] = f;
      }
    }
    if (transposed) {  // uniform over the block
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

void launch_momenta(float* Bs, float* Bf, const float* G, int64_t rows, int64_t cols, float mu_s,
                    float mu_f, const bool* ok, void* Xs, void* Xf, FloatType x_type,
                    bool transposed, cudaStream_t stream) {
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, kMaxBlocks));
  with_type(x_type, [&](auto* tag) {
    using TX = std::remove_pointer_t<decltype(tag)>;
    momenta_kernel<TX><<<grid, kThreads, 0, stream>>>(Bs, Bf, G, rows, cols, mu_s, mu_f, ok,
                                                      static_cast<TX*>(Xs), static_cast<TX*>(Xf),
                                                      transposed);
  });
}

}  // namespace fogo::cuda

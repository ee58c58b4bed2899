#pragma once
// Multi-tensor launches: a chunk of parameters (a table in the kernel's argument space) walked
// by one grid, each block taking tiles (or element blocks) of one parameter at a time. The
// layout says where each parameter's range starts in the launch's flattened index space.

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace fogo::cuda {

/// offsets[k] = the first index of parameter k, offsets[count] = the total.
template <int N>
struct TileLayout {
  int64_t tiles[N + 1];
};

/// The layout of a chunk's kTile x kTile tiles: dims(k) gives parameter k's (rows, cols).
template <int kTile, int N, typename Dims>
TileLayout<N> tile_layout(int count, Dims&& dims) {
  TileLayout<N> l{};
  for (int k = 0; k < count; ++k) {
    const auto [rows, cols] = dims(k);
    l.tiles[k + 1] = l.tiles[k] + ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  }
  return l;
}

/// tile_layout for a chunk whose entries have `rows` and `cols`.
template <int kTile, typename Chunk>
auto tile_layout(const Chunk& chunk) {
  constexpr int N = sizeof(chunk.t) / sizeof(chunk.t[0]);
  return tile_layout<kTile, N>(chunk.count, [&](int k) {
    return std::pair<int64_t, int64_t>{chunk.t[k].rows, chunk.t[k].cols};
  });
}

/// The parameter whose range [offsets[k], offsets[k+1]) holds `index` (a short scan: at most a
/// chunk's entries, read in place from the kernel's argument space: the tables are
/// __grid_constant__, so indexing them makes no per-thread copy).
__device__ __forceinline__ int owner(const int64_t* offsets, int count, int64_t index) {
  int k = 0;
  while (k + 1 < count && offsets[k + 1] <= index) ++k;
  return k;
}

/// Where grid index `g` (a tile of the chunk) lies: its parameter k and the first row and column
/// of its kTile x kTile tile in that parameter's [rows, cols].
struct TileOrigin {
  int k;
  int64_t r0, c0;
};
template <int kTile, typename Chunk>
__device__ __forceinline__ TileOrigin tile_origin(const Chunk& chunk, const int64_t* tiles,
                                                  int64_t g) {
  const int k = owner(tiles, chunk.count, g);
  const int64_t tiles_c = (chunk.t[k].cols + kTile - 1) / kTile, local = g - tiles[k];
  return {k, (local / tiles_c) * kTile, (local % tiles_c) * kTile};
}

}  // namespace fogo::cuda

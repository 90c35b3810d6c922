// Which row tiles of the experts' grouped pairs a grouped-GEMM launch takes (moe_grouped.cuh's
// unit_of_block on the device, the launches' grid sizes on the host): plain arithmetic shared by
// both and tested on the CPU.
//
// Expert e's pairs come in ceil(pairs(e) / rows) row tiles. A launch takes every tile, or the
// tiles two by two (tiles 2 p and 2 p + 1: one unit for a cluster of two blocks, block rank r
// taking tile 2 p + r), or the last tile of an odd count: pairs and odd last tiles together are
// every tile once.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.h"

namespace glms::ops::cuda::moe_tiles {

enum class TileSet { kEvery, kPairs, kOddLast };

GLMS_HOST_DEVICE inline int tiles_of(int pairs, int rows) { return (pairs + rows - 1) / rows; }

// The units of `set` of an expert with `tiles` row tiles, in one output slice.
GLMS_HOST_DEVICE inline int units_of(TileSet set, int tiles) {
  return set == TileSet::kEvery ? tiles : set == TileSet::kPairs ? tiles / 2 : tiles % 2;
}

// The row tile that unit i (< units_of(set, tiles)) of the expert gives block `rank` of its
// cluster (kPairs; 0 otherwise).
GLMS_HOST_DEVICE inline int tile_of(TileSet set, int tiles, int i, int rank) {
  return set == TileSet::kEvery ? i : set == TileSet::kPairs ? 2 * i + rank : tiles - 1;
}

// At least the units of `set` in one slice, whatever the split of num_pairs pairs over
// num_experts experts: a tile is at most `rows` pairs and at most one per expert is part-filled;
// a pair of tiles holds a full tile and at least one pair more; an odd last tile is one an expert.
inline int64_t units_bound(TileSet set, int64_t num_pairs, int num_experts, int rows) {
  const int64_t tiles = (num_pairs + rows - 1) / rows + std::min<int64_t>(num_experts, num_pairs);
  return set == TileSet::kEvery ? tiles
         : set == TileSet::kPairs ? num_pairs / (rows + 1) + 1
                                  : std::min<int64_t>(num_experts, num_pairs);
}

}  // namespace glms::ops::cuda::moe_tiles

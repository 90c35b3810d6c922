// Which row tiles of the experts' grouped pairs a grouped-GEMM launch takes (moe_grouped.cuh's
// unit_of_block on the device, the launches' grid sizes on the host): plain arithmetic shared by
// both and tested on the CPU.
//
// Expert e's pairs come in ceil(pairs(e) / rows) row tiles. A launch takes every tile, or the
// tiles two by two for clusters of two blocks (tiles 2 p and 2 p + 1: one unit, block rank r
// taking tile 2 p + r and all of the unit's weight lines), an odd last tile being one unit too
// whose two blocks take half of the lines each.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.h"

namespace glms::ops::cuda::moe_tiles {

enum class TileSet { kEvery, kPairs };

GLMS_HOST_DEVICE inline int tiles_of(int pairs, int rows) { return (pairs + rows - 1) / rows; }

// The units of `set` of an expert with `tiles` row tiles, in one output slice.
GLMS_HOST_DEVICE inline int units_of(TileSet set, int tiles) {
  return set == TileSet::kEvery ? tiles : (tiles + 1) / 2;
}

// Whether unit i of the expert is an odd last tile, its lines split between the cluster's blocks.
GLMS_HOST_DEVICE inline bool splits_lines(TileSet set, int tiles, int i) {
  return set == TileSet::kPairs && 2 * i + 1 == tiles;
}

// The row tile that unit i (< units_of(set, tiles)) of the expert gives block `rank` of its
// cluster (kPairs; 0 otherwise).
GLMS_HOST_DEVICE inline int tile_of(TileSet set, int tiles, int i, int rank) {
  return set == TileSet::kEvery ? i : splits_lines(set, tiles, i) ? tiles - 1 : 2 * i + rank;
}

// At least the units of `set` in one slice, whatever the split of num_pairs pairs over
// num_experts experts: a tile is at most `rows` pairs and at most one per expert is part-filled,
// so the tiles are at most ceil(num_pairs / rows) + n for the n experts with pairs, and their
// units of kPairs at most half of that plus n / 2.
inline int64_t units_bound(TileSet set, int64_t num_pairs, int num_experts, int rows) {
  const int64_t experts = std::min<int64_t>(num_experts, num_pairs);
  const int64_t tiles = (num_pairs + rows - 1) / rows + experts;
  return set == TileSet::kEvery ? tiles : (tiles + experts + 1) / 2;
}

}  // namespace glms::ops::cuda::moe_tiles

// The order of a token row's values in the wgmma streamed expert kernels' staged rows
// (moe_experts_stream.cu): plain arithmetic shared by the staging kernel, the gate/up kernel that
// writes the down projection's rows in that order, and a CPU test.
//
// wgmma reads its B operand (the tokens) in stored k order, and a lane widens its weight codes
// into the A registers in the tile layout's order (quant/mxfp4_tiles.h), so each 32-value block
// of a staged row is permuted to match: position 16 h + 8 i + 2 t + e holds value
// 8 t + 4 h + 2 i + e (h the block's wgmma, i the register pair, t the lane's quad position, e the
// half of a bf16 pair). In 32-bit words of bf16 pairs: staged word 8 h + 4 i + t holds source
// pair 4 t + 2 h + i.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace glms::ops::cuda {

// The source pair (< 16) of a 32-value block's staged word q (< 16).
GLMS_HOST_DEVICE constexpr int staged_source_pair(int q) { return 4 * (q % 4) + 2 * (q / 8) + (q / 4) % 2; }

// Where value v of a row sits in its staged row.
GLMS_HOST_DEVICE constexpr int64_t staged_position(int64_t v) {
  const int w = static_cast<int>(v & 31), t = w >> 3, h = (w >> 2) & 1, i = (w >> 1) & 1, e = w & 1;
  return (v & ~int64_t{31}) + 16 * h + 8 * i + 2 * t + e;
}

}  // namespace glms::ops::cuda

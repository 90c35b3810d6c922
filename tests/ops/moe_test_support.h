// What the CUDA MoE tests share (test_cuda_moe.cpp, test_cuda_moe_routing.cpp): random expert
// choices and the device buffers of a MoE plan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe.h"

namespace glms::testing {

// Distinct random experts per token: [n, top_k].
inline std::vector<int32_t> random_choices(int n, int E, int top_k, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  std::vector<int32_t> all(E);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < n; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

struct PlanBuffers {
  ops::cuda::DeviceBuffer counts, offsets, active, num_active, sorted_pairs, pair_slot;
  PlanBuffers(int E, int64_t P)
      : counts(sizeof(int32_t) * (E + 1)),
        offsets(sizeof(int32_t) * (E + 1)),
        active(sizeof(int32_t) * E),
        num_active(sizeof(int32_t)),
        sorted_pairs(sizeof(int32_t) * P),
        pair_slot(sizeof(int32_t) * P) {}
  ops::cuda::MoePlan plan() const {
    return {counts.as<int32_t>(), offsets.as<int32_t>(), active.as<int32_t>(), num_active.as<int32_t>(),
            sorted_pairs.as<int32_t>(), pair_slot.as<int32_t>()};
  }
};

}  // namespace glms::testing

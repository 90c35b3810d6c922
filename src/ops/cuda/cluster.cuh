// The blocks that share one row of work: a thread block cluster of kBlocks (Hopper), or a block
// alone (kBlocks 1, where every helper is free). Values cross blocks through distributed shared
// memory and are combined in rank order, so every block of the cluster gets the same bits and
// takes the same decisions. Every thread of every block of the cluster calls each helper
// (they synchronise the cluster); `slot` and `local` live in the calling block's shared memory.
#pragma once

#include <cooperative_groups.h>

namespace glms::ops::cuda {

template <int kBlocks>
struct ClusterBlocks {
  __device__ static int rank() {
    if constexpr (kBlocks == 1) return 0;
    else return static_cast<int>(cooperative_groups::this_cluster().block_rank());
  }

  // op over the blocks' `value` (the same in every thread of a block).
  template <typename T, typename Op>
  __device__ static T all_reduce(T value, T* slot, Op op) {
    if constexpr (kBlocks == 1) {
      return value;
    } else {
      auto cluster = cooperative_groups::this_cluster();
      if (threadIdx.x == 0) *slot = value;
      cluster.sync();
      T result = *cluster.map_shared_rank(slot, 0);
      for (int b = 1; b < kBlocks; ++b) result = op(result, *cluster.map_shared_rank(slot, b));
      cluster.sync();  // every block has read the slots before any writes them again
      return result;
    }
  }

  // The sum of `value` (the same in every thread of a block) over the blocks before this one, in
  // rank order; *all gets the sum over every block.
  template <typename T>
  __device__ static T sum_of_earlier_blocks(T value, T* slot, T* all) {
    if constexpr (kBlocks == 1) {
      *all = value;
      return 0;
    } else {
      auto cluster = cooperative_groups::this_cluster();
      if (threadIdx.x == 0) *slot = value;
      cluster.sync();
      T before = 0, sum = 0;
      for (int b = 0; b < kBlocks; ++b) {
        if (b == static_cast<int>(cluster.block_rank())) before = sum;
        sum += *cluster.map_shared_rank(slot, b);
      }
      cluster.sync();
      *all = sum;
      return before;
    }
  }

  // combined[i] = the sum over the blocks of local[i] for i < count (count <= blockDim.x); returns
  // combined, or local itself for a block alone. The block's local values must be complete.
  template <typename T>
  __device__ static const T* sum_arrays(const T* local, T* combined, int count) {
    if constexpr (kBlocks == 1) {
      return local;
    } else {
      auto cluster = cooperative_groups::this_cluster();
      cluster.sync();
      if (static_cast<int>(threadIdx.x) < count) {
        T sum = 0;
        for (int b = 0; b < kBlocks; ++b) sum += cluster.map_shared_rank(local, b)[threadIdx.x];
        combined[threadIdx.x] = sum;
      }
      cluster.sync();  // every block has read the arrays before any rewrites its own
      return combined;
    }
  }
};

}  // namespace glms::ops::cuda

// Kernel launches of ops/cuda, chained by programmatic dependent launch (sm_90): a decode step
// at batch 1 is about 35 dependent kernels a layer, most of them a few microseconds long, and
// without chaining each one pays for its launch and for filling the GPU only after the previous
// one has drained. A chained kernel's blocks may be scheduled while the kernel before it in the
// stream still runs; they wait in chained_grid_prologue() until that kernel has finished and its
// writes are visible, then let the kernel after them be scheduled in turn.
//
// Contract: every kernel launched by launch_chained() calls chained_grid_prologue() (or
// wait_for_previous_grid()) before it reads or writes global memory that kernels write (the
// previous kernel's outputs are not visible before it, and that kernel may still be reading what
// this one writes); only L2 prefetches and loads of what no kernel writes (weights) may come
// first. The wait is transitive: the previous kernel itself waited for its own predecessor.
// Kernels of other libraries (cuBLAS) and copies between chained kernels keep the ordinary stream
// order. In CUDA graphs the chaining becomes a programmatic edge.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

// Lets the next chained kernel in the stream be scheduled once every block of this one has
// called it (or exited).
__device__ __forceinline__ void release_dependent_grids() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Waits until the previous kernel in the stream has finished and its writes are visible.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The first statement of a kernel launched by launch_chained(), unless the kernel does useful work
// that reads nothing the previous kernels write (an L2 prefetch of its weights) before waiting.
__device__ __forceinline__ void chained_grid_prologue() {
  wait_for_previous_grid();
  release_dependent_grids();
}

// Brings the 128-byte line holding `address` into L2. Coherent whatever runs before it: a line
// written afterwards is updated in L2, so weights may be prefetched before the wait.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// Grids of more blocks launch plainly: a kernel of many waves gains nothing measurable from an
// earlier start.
constexpr unsigned long long kMaxChainedBlocks = 16384;

// Blocks for an elementwise pass over `count` items, `threads` a block, whose kernel strides over
// the grid: at most 16 blocks an SM. Every block pays the chained prologue, and at prefill sizes
// (10^5 blocks and more of one item a thread) that cost 0.28 ms a layer at 8192 tokens.
inline unsigned elementwise_blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads, most = 16 * int64_t{multiprocessor_count()};
  return static_cast<unsigned>(blocks < most ? blocks : most);
}

// for (i = this thread's first item; i < count; i += the grid's threads), for elementwise kernels.
#define GLMS_GRID_STRIDE_LOOP(i, count)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// kernel(args...) over `grid` blocks of `block` threads with `shared_bytes` of dynamic shared
// memory in `stream`, in thread-block clusters of `cluster` blocks along x (1: none), as a chained
// launch (plain above kMaxChainedBlocks), checked; `what` names it in the error.
template <typename... Params, typename... Args>
void launch_chained_clusters(const char* what, void (*kernel)(Params...), unsigned cluster, dim3 grid, dim3 block,
                             size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (static_cast<unsigned long long>(grid.x) * grid.y * grid.z <= kMaxChainedBlocks) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster, 1, 1};
  }
  config.attrs = attributes;
  config.numAttrs = count;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

// The same without clusters.
template <typename... Params, typename... Args>
void launch_chained(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                    cudaStream_t stream, Args&&... args) {
  launch_chained_clusters(what, kernel, 1, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}

}  // namespace glms::ops::cuda

// Hopper's pieces for warp-specialised kernels, where producer warps fill shared memory and
// consumer warpgroups multiply (mla_wgmma_specialized.cu, mla_wgmma_ring.cu,
// moe_experts_specialized.cu):
// transaction barriers in shared memory (mbarrier) that cp.async copies complete, named barriers
// between some warps of a block, and the per-warpgroup register budget (setmaxnreg).
//
// An mbarrier counts arrivals; when `count` have arrived its phase completes and the next phase
// begins. wait(parity) returns once the phase of that parity has completed: a fresh barrier is
// in phase 0, so waiting on parity 1 passes at once (the phase before it counts as complete).
#pragma once

#include <cstdint>

namespace glms::ops::cuda::pipeline {

__device__ __forceinline__ void barrier_init(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
// Makes barrier_init's writes visible to the block's other threads (then __syncthreads).
__device__ __forceinline__ void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void barrier_arrive(uint32_t barrier) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier) : "memory");
}

// One arrival once every cp.async this thread has issued so far has landed (noinc: the arrival
// is one of the barrier's `count`).
__device__ __forceinline__ void barrier_arrive_on_copies(uint32_t barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// The try_wait loop of barrier_wait, its acquire at the scope SCOPE ("": the block's).
#define GLMS_BARRIER_WAIT_LOOP(SCOPE)                                      \
  "{\n.reg .pred done;\n"                                                  \
  "WAIT:\n"                                                                \
  "mbarrier.try_wait.parity" SCOPE ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra WAIT;\n}\n"

__device__ __forceinline__ void barrier_wait(uint32_t barrier, uint32_t parity) {
  asm volatile(GLMS_BARRIER_WAIT_LOOP("") ::"r"(barrier), "r"(parity) : "memory");
}

// Whether the phase of that parity has completed, the thread suspended until it does or for about
// `nanoseconds` at most (a hint): a poll that does not take issue slots from the warps it waits for.
__device__ __forceinline__ bool barrier_try_wait_for(uint32_t barrier, uint32_t parity, uint32_t nanoseconds) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity), "r"(nanoseconds)
      : "memory");
  return done != 0;
}

// Thread block clusters (moe_experts_specialized.cu's pairs of blocks): `address` (a
// shared-memory address of this block) as the shared::cluster address of the same offset in
// block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t address, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(address), "r"(rank));
  return out;
}
// One arrival on a barrier of any block of the cluster (a cluster_address), released at the
// block's scope only: enough to hand back a stage whose reads (wgmma's, waited for) are done. A
// cluster-scope release would also wait for the thread's wgmma still in flight.
__device__ __forceinline__ void barrier_arrive_cluster(uint32_t cluster_barrier) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_barrier) : "memory");
}
// barrier_wait for arrivals from other blocks of the cluster (acquired at cluster scope).
__device__ __forceinline__ void barrier_wait_cluster(uint32_t barrier, uint32_t parity) {
  asm volatile(GLMS_BARRIER_WAIT_LOOP(".acquire.cluster") ::"r"(barrier), "r"(parity) : "memory");
}
// This thread's arrival, announcing `bytes` that tensor copies will complete on the barrier in its
// current phase (they may land before or after the announcement).
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint32_t barrier, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(barrier),
               "r"(bytes)
               : "memory");
}
// The box at (c0, c1) (innermost coordinate first) of a 2D tensor map into shared memory at
// `address` of every block of the cluster in `mask`, the same offset in each, completing its
// bytes on each one's barrier at `barrier`'s offset. `tensor_map`: a __grid_constant__ parameter.
__device__ __forceinline__ void tensor_copy_2d_multicast(uint32_t address, const void* tensor_map, int c0, int c1,
                                                         uint32_t barrier, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(address),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(barrier), "h"(mask)
      : "memory");
}
// The box at (c0, c1) of a 2D tensor map into this block's shared memory at `address`,
// completing its bytes on `barrier`. `tensor_map`: a __grid_constant__ parameter.
__device__ __forceinline__ void tensor_copy_2d(uint32_t address, const void* tensor_map, int c0, int c1,
                                               uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          address),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(barrier)
      : "memory");
}
// Four floats of another block's shared memory (a cluster_address).
__device__ __forceinline__ float4 load_cluster_float4(uint32_t cluster_address) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_address)
               : "memory");
  return v;
}
// Two floats of another block's shared memory (a cluster_address, 8-byte aligned).
__device__ __forceinline__ float2 load_cluster_float2(uint32_t cluster_address) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(cluster_address) : "memory");
  return v;
}
// Every thread of every block of the cluster meets here.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// A ring of kStages stages' barriers from `full` and `empty` (8 bytes a stage), set up by thread
// 0: full ones expecting full_count arrivals, empty ones empty_count; then every thread of the
// block (kCluster: of every block of the cluster, whose copies and arrivals may then start) meets.
template <int kStages, bool kCluster>
__device__ __forceinline__ void init_ring(uint32_t full, uint32_t empty, int full_count, int empty_count) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(full + 8 * s, full_count);
      barrier_init(empty + 8 * s, empty_count);
    }
    barrier_init_fence();
  }
  if constexpr (kCluster) cluster_sync();
  else __syncthreads();
}

// A consumer thread is done reading a stage whose empty barrier is `empty`. kCluster: the ring is
// filled in kBlocks blocks of the cluster at once, so lane r of each consumer warp tells block r
// (at the block's scope: enough where the reads, wgmma's, are waited for).
template <bool kCluster, int kBlocks = 2>
__device__ __forceinline__ void release_stage(uint32_t empty) {
  if constexpr (kCluster) {
    const uint32_t lane = threadIdx.x % 32;
    if (lane < kBlocks) barrier_arrive_cluster(cluster_address(empty, lane));
  } else {
    barrier_arrive(empty);
  }
}

// Named barrier `id` (1..15; 0 is __syncthreads') of `threads` threads, whole warps: sync waits
// for all of them, arrive counts this warp in and goes on.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The calling warpgroup's registers per thread from here on (a multiple of 8, 24..256): producers
// give theirs up so that consumers can hold larger accumulators.
template <int kRegisters>
__device__ __forceinline__ void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace glms::ops::cuda::pipeline

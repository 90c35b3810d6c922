// Hopper's pieces for warp-specialised kernels, where producer warps fill shared memory and
// consumer warpgroups multiply (mla_wgmma_specialized.cu, moe_experts_specialized.cu):
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

__device__ __forceinline__ void barrier_wait(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// Whether the phase of that parity has completed, without waiting.
__device__ __forceinline__ bool barrier_test(uint32_t barrier, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
  return done != 0;
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

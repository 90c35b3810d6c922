// Hopper warpgroup tensor-core building blocks shared by the wgmma kernels (mla_wgmma.cu,
// mla_wgmma_specialized.cu, mla_wgmma_ring.cu, moe_experts_wgmma.cu, moe_experts_wgmma_fp8.cu,
// moe_experts_stream.cu, moe_experts_specialized.cu):
// cp.async copies, the 128- and 64-byte shared-memory swizzles, matrix descriptors and the wgmma shapes
// they use (bf16, and two of E4M3 codes).
//
// Operands live in shared memory as 128-byte lines (64 bf16) in groups of 8 lines aligned to
// 1024 bytes, 16-byte chunk c of line r stored at chunk c ^ (r % 8): the layout wgmma's
// 128-byte swizzle mode reads. A K-major operand (a line holds 64 consecutive k of one row)
// advances 16 k by adding 32 bytes to the descriptor's start; the next 64 k are another block
// of lines.
#pragma once

#include <cstdint>

namespace glms::ops::cuda::wgmma {

constexpr int kLineBytes = 128;

// Byte offset of 16-byte chunk `chunk` of line `line` in a 1024-aligned swizzled group.
__device__ __forceinline__ uint32_t swizzled(int line, int chunk) {
  return static_cast<uint32_t>(line * kLineBytes + ((chunk ^ (line & 7)) << 4));
}

// 16 bytes from global to shared memory; src_bytes 0 writes zeros.
// Dynamic shared memory from its first 1024-byte boundary, where the 128-byte swizzle pattern
// starts over (descriptors and swizzled() address it from there): its shared-window address and
// generic pointer. Kernels ask for 1 KB more than they lay out.
struct AlignedShared {
  uint32_t address;
  uint8_t* generic;
};
__device__ __forceinline__ AlignedShared align_to_1024(uint8_t* shared_raw) {
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  return {raw + pad, shared_raw + pad};
}

__device__ __forceinline__ void copy_async_16(uint32_t shared_address, const void* global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global), "r"(src_bytes));
}
// The same, asking L2 to fetch the 256-byte span around the source (gathers of whole rows).
__device__ __forceinline__ void copy_async_16_l2_256(uint32_t shared_address, const void* global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global),
               "r"(src_bytes));
}
// 4 bytes from global to shared memory (through L1); src_bytes 0 writes zeros.
__device__ __forceinline__ void copy_async_4(uint32_t shared_address, const void* global, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address), "l"(global), "r"(src_bytes));
}
// 8 bytes from global to shared memory (through L1).
__device__ __forceinline__ void copy_async_8(uint32_t shared_address, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared_address), "l"(global));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Shared-memory writes of the generic proxy (stores, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (K-major: stride = 1024 between groups of 8 lines, leading unused; MN-major: leading
// = between 64-column blocks, stride = between groups of 8 K lines).
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3ffffu) >> 4) | static_cast<uint64_t>((leading_bytes >> 4) & 0x3fffu) << 16 |
         static_cast<uint64_t>((stride_bytes >> 4) & 0x3fffu) << 32 | uint64_t{1} << 62;
}
// The same for 64-byte swizzled lines (32 bf16 each, in groups of 8 lines aligned to 512 bytes,
// 16-byte chunk c of line r stored at chunk c ^ ((r / 2) % 4): swizzled_64B). K-major: stride =
// 512 between groups of 8 lines; 16 k further is 32 bytes further in the line.
__device__ __forceinline__ uint64_t descriptor_64B(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3ffffu) >> 4) | static_cast<uint64_t>((leading_bytes >> 4) & 0x3fffu) << 16 |
         static_cast<uint64_t>((stride_bytes >> 4) & 0x3fffu) << 32 | uint64_t{2} << 62;
}
__device__ __forceinline__ uint32_t swizzled_64B(int line, int chunk) {
  return static_cast<uint32_t>(line * 64 + ((chunk ^ ((line >> 1) & 3)) << 4));
}
// descriptor(address + bytes, ...) from descriptor(address, ...): one add instead of building
// it again (bytes a multiple of 16; the 14-bit address field cannot carry, as a block's shared
// memory ends below 256 KB).
__device__ __forceinline__ uint64_t descriptor_advanced(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Orders the compiler's uses of accumulator registers against the asynchronous wgmma that write them.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Accumulator fragments: lane (g, t) = (lane / 4, lane % 4) of warp w of the warpgroup holds
// d[4 j + e] at row 16 w + g + 8 (e / 2), column 8 j + 2 t + e % 2.

#define GLMS_WGMMA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define GLMS_WGMMA_F16(i) GLMS_WGMMA_F4(i), GLMS_WGMMA_F4(i + 4), GLMS_WGMMA_F4(i + 8), GLMS_WGMMA_F4(i + 12)
// The PTX operand lists of 16, 32, 64 and 128 accumulators, %0 onwards (the outputs above).
#define GLMS_WGMMA_R0_15 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define GLMS_WGMMA_R16_31 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define GLMS_WGMMA_R32_63                                                              \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define GLMS_WGMMA_R64_127                                                                       \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define GLMS_WGMMA_D16 "{" GLMS_WGMMA_R0_15 "}"
#define GLMS_WGMMA_D32 "{" GLMS_WGMMA_R0_15 ", " GLMS_WGMMA_R16_31 "}"
#define GLMS_WGMMA_D64 "{" GLMS_WGMMA_R0_15 ", " GLMS_WGMMA_R16_31 ", " GLMS_WGMMA_R32_63 "}"
#define GLMS_WGMMA_D128 "{" GLMS_WGMMA_R0_15 ", " GLMS_WGMMA_R16_31 ", " GLMS_WGMMA_R32_63 ", " GLMS_WGMMA_R64_127 "}"

// d[64 x 16] (+)= A[64 x 16] B[16 x 16], both K-major; d starts over when `accumulate` is 0.
__device__ __forceinline__ void m64n16k16(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : GLMS_WGMMA_F4(0), GLMS_WGMMA_F4(4)
      : "l"(a), "l"(b), "r"(accumulate));
}

// d[64 x 32] (+)= A[64 x 16] B[16 x 32], both K-major; d starts over when `accumulate` is 0.
__device__ __forceinline__ void m64n32k16(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      GLMS_WGMMA_D16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : GLMS_WGMMA_F16(0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// d[64 x 64] (+)= A[64 x 16] B[16 x 64], both K-major; d starts over when `accumulate` is 0.
__device__ __forceinline__ void m64n64k16(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      GLMS_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16)
      : "l"(a), "l"(b), "r"(accumulate));
}

// d[64 x 128] (+)= A[64 x 16] B[16 x 128], A K-major, B K-major (kTransB 0) or MN-major (1); d
// starts over when `accumulate` is 0.
template <int kTransB>
__device__ __forceinline__ void m64n128k16(float (&d)[64], uint64_t a, uint64_t b, int accumulate = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %67, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      GLMS_WGMMA_D64 ", %64, %65, p, 1, 1, 0, %66;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16), GLMS_WGMMA_F16(32), GLMS_WGMMA_F16(48)
      : "l"(a), "l"(b), "n"(kTransB), "r"(accumulate));
}
// d[64 x 128] (+)= A[64 x 32] B[32 x 128] of E4M3 codes, both K-major (as 8-bit operands must
// be: a 128-byte line holds 128 k); d starts over when `accumulate` is 0.
__device__ __forceinline__ void m64n128k32_e4m3(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      GLMS_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16), GLMS_WGMMA_F16(32), GLMS_WGMMA_F16(48)
      : "l"(a), "l"(b), "r"(accumulate));
}
// d[64 x 256] += A[64 x 16] B[16 x 256], A K-major, B K-major (kTransB 0) or MN-major (1).
template <int kTransB = 0>
__device__ __forceinline__ void m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      GLMS_WGMMA_D128 ", %128, %129, p, 1, 1, 0, %131;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16), GLMS_WGMMA_F16(32), GLMS_WGMMA_F16(48), GLMS_WGMMA_F16(64),
        GLMS_WGMMA_F16(80), GLMS_WGMMA_F16(96), GLMS_WGMMA_F16(112)
      : "l"(a), "l"(b), "r"(1), "n"(kTransB));
}

// d[64 x N] += A[64 x 16] B[16 x N], A from registers, B K-major in shared memory (N = 8, 16,
// 24, 32, 64 or 128). Warp w of the warpgroup supplies rows 16 w .. 16 w + 15 of A in mma.sync
// m16n8k16's A layout: lane (g, t) a[0] = (row g, k 2t, 2t + 1), a[1] = (row g + 8, the same k),
// a[2] = (row g, k 2t + 8, + 9), a[3] = (row g + 8, k 2t + 8, + 9). The hardware reads the
// registers asynchronously: they must not change before the group's wait.
template <int M>
__device__ __forceinline__ void rs_m64n8k16(float (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert(M >= 4, "the sums of 8 columns");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F4(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <int M>
__device__ __forceinline__ void rs_m64n16k16(float (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert(M >= 8, "the sums of 16 columns");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F4(0), GLMS_WGMMA_F4(4)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <int M>
__device__ __forceinline__ void rs_m64n24k16(float (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert(M >= 12, "the sums of 24 columns");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F4(0), GLMS_WGMMA_F4(4), GLMS_WGMMA_F4(8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
template <int M>
__device__ __forceinline__ void rs_m64n32k16(float (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert(M >= 16, "the sums of 32 columns");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      GLMS_WGMMA_D16 ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F16(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
__device__ __forceinline__ void rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      GLMS_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
__device__ __forceinline__ void rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      GLMS_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16), GLMS_WGMMA_F16(32), GLMS_WGMMA_F16(48)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// d[64 x 256] += A[64 x 16] B[16 x 256], A from registers (rs_m64n8k16's layout), B MN-major
// in shared memory (a line holds 64 of the 256 columns of one k).
__device__ __forceinline__ void rs_m64n256k16_mn(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      GLMS_WGMMA_D128 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : GLMS_WGMMA_F16(0), GLMS_WGMMA_F16(16), GLMS_WGMMA_F16(32), GLMS_WGMMA_F16(48), GLMS_WGMMA_F16(64),
        GLMS_WGMMA_F16(80), GLMS_WGMMA_F16(96), GLMS_WGMMA_F16(112)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// rs_m64nNk16 by the token count N (B K-major). d may hold more columns' sums than N (its first
// N / 2 are the N columns' sums, as in every m64nNk16 layout; the rest are left as they are), so
// that one accumulator serves a chunk's narrower multiplies.
template <int N, int M = N / 2>
__device__ __forceinline__ void rs_m64k16(float (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert(M >= N / 2, "the sums of N columns");
  static_assert(N == 8 || N == 16 || N == 24 || N == 32 || N == 64 || N == 128, "N of 8, 16, 24, 32, 64 or 128");
  if constexpr (N == 8) rs_m64n8k16(d, a, b);
  else if constexpr (N == 16) rs_m64n16k16(d, a, b);
  else if constexpr (N == 24) rs_m64n24k16(d, a, b);
  else if constexpr (N == 32) rs_m64n32k16(d, a, b);
  else if constexpr (N == 64) rs_m64n64k16(d, a, b);
  else rs_m64n128k16(d, a, b);
}
#undef GLMS_WGMMA_F16
#undef GLMS_WGMMA_F4

}  // namespace glms::ops::cuda::wgmma

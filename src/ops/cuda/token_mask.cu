// Structured-output token masks on the device (cuda_ops.h: apply_token_masks): the masked rows
// of a step's logits get -infinity where their mask's bit is clear, before the argmax and the
// draws read them, so that a constrained row sends its token back instead of its whole row.
//
// One thread per logit: the 32 lanes of a warp cover one mask word (a block starts on a multiple
// of 32 ids), read once and broadcast; an allowed logit is never written, so it keeps its value
// bit for bit. grid.y walks the masked rows (strided past the 65535 a grid dimension allows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/launch.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kMaskThreads = 256;  // a multiple of 32: each warp reads one mask word
constexpr int64_t kMaxGridRows = 65535;

__global__ void __launch_bounds__(kMaskThreads)
    apply_token_masks_kernel(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* masks, int64_t count) {
  chained_grid_prologue();
  const int64_t words = (vocab + 31) / 32;
  const int64_t t = int64_t{blockIdx.x} * kMaskThreads + threadIdx.x;
  if (t >= vocab) return;
  for (int64_t m = blockIdx.y; m < count; m += gridDim.y) {
    const uint32_t word = __ldg(masks + m * words + t / 32);
    if (!((word >> (t % 32)) & 1u)) {
      const int64_t row = rows ? static_cast<int64_t>(__ldg(rows + m)) : m;
      logits[row * vocab + t] = -INFINITY;
    }
  }
}

}  // namespace

void apply_token_masks(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* masks, int64_t count,
                       cudaStream_t stream) {
  if (count == 0) return;
  GLMS_CHECK(count > 0 && vocab > 0, "apply_token_masks: a positive vocabulary and row count");
  const dim3 grid(static_cast<unsigned>((vocab + kMaskThreads - 1) / kMaskThreads),
                  static_cast<unsigned>(std::min(count, kMaxGridRows)));
  launch_chained("apply_token_masks launch", apply_token_masks_kernel, grid, kMaskThreads, 0, stream, logits, vocab,
                 rows, masks, count);
}

}  // namespace glms::ops::cuda

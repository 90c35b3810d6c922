// GEMV for decode-sized batches: y[n, rows] = x[n, cols] . W[rows, cols]^T, n <= 4, bf16 or
// fp32 x and weights (fp32 x against bf16 weights for the MoE router), one matrix or a group of
// matrices that read the same x.
//
// Why: at one to four tokens a linear layer is a pass over its weights, and cuBLAS's GEMM
// kernels leave bandwidth unused on narrow outputs (kv_a 576 rows, indexer wk 128, weights_proj
// 32) and add a split-K workspace pass. Here a block owns four rows and its eight warps split
// the row length between them, and a block-level sum finishes each output. A group (the
// attention's input projections all read the normed hidden state) runs as one launch whose
// blocks cover every matrix's rows, so the narrow ones ride along with the wide ones instead of
// each being a small, underfilled launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRows = 4;  // rows per block
// Matrices with fewer rows than this many blocks' worth of kGemvRows (the MoE router's 256)
// take a block per row instead, so that the launch still covers every SM.
constexpr int kMinBlocksForFourRows = 264;

__device__ __forceinline__ void widen8(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// 16 bytes of a row: eight bf16 or four fp32 values.
template <typename T>
struct Chunk;
template <>
struct Chunk<uint16_t> {
  static constexpr int kValues = 8;
  __device__ static void load(const uint16_t* row, int64_t c, float* out) {
    widen8(__ldg(reinterpret_cast<const uint4*>(row) + c), out);
  }
};
template <>
struct Chunk<float> {
  static constexpr int kValues = 4;
  __device__ static void load(const float* row, int64_t c, float* out) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(row) + c);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};

// The x values that meet chunk c of a row of W: the same type's chunk, or, for fp32 x against
// bf16 weights (the MoE router), the eight fp32 values of two 16-byte loads.
template <typename X, typename W>
struct XChunk {
  static_assert(std::is_same_v<X, W>, "x as w, or fp32 x against bf16 w");
  __device__ static void load(const X* row, int64_t c, float* out) { Chunk<X>::load(row, c, out); }
};
template <>
struct XChunk<float, uint16_t> {
  __device__ static void load(const float* row, int64_t c, float* out) {
    Chunk<float>::load(row, 2 * c, out);
    Chunk<float>::load(row, 2 * c + 1, out + 4);
  }
};

// Rows row0 .. row0 + kRows - 1 of one matrix for the block: x and w of one element type, or
// fp32 x against bf16 w. It opens the chained launch itself (launch.cuh): weight lines are
// prefetched before the wait.
template <int kTokens, typename X, typename W, int kRows = kGemvRows>
__device__ __forceinline__ void gemv_block(const X* x, int n, int64_t ld_x, const W* w, int64_t rows, int64_t cols,
                                           float* y, int64_t ld_y, int64_t row0) {
  constexpr int kValues = Chunk<W>::kValues;
  constexpr int kGemvRows = kRows;
  __shared__ float partial[kGemvWarps][kGemvRows][kTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const W* w_rows[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) w_rows[r] = w + min(row0 + r, rows - 1) * cols;
  // This warp's share of the row: 16-byte chunks [begin, end), lane-strided.
  const int64_t chunks = cols / kValues;
  const int64_t begin = chunks * warp / kGemvWarps, end = chunks * (warp + 1) / kGemvWarps;
  // The lane's first chunk of each row into L2 while the previous kernel finishes (launched
  // chained: a decode step's GEMVs follow short kernels whose tails would otherwise idle HBM).
  release_dependent_grids();
  if (begin + lane < end) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) prefetch_l2(reinterpret_cast<const uint4*>(w_rows[r]) + begin + lane);
  }
  wait_for_previous_grid();
  float acc[kGemvRows][kTokens];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = 0.0f;
  // A block a row (the router's 256 rows) gives a lane only a few chunks: kPasses passes' loads
  // go out together, predicated, so that they are one round trip to memory rather than one each
  // (four rows a block already have four loads in flight a pass). The sums' order is unchanged.
  constexpr int kPasses = kGemvRows == 1 ? 4 : 1;
  for (int64_t c0 = begin + lane; c0 < end; c0 += 32 * kPasses) {
    float wv[kPasses][kGemvRows][kValues];
#pragma unroll
    for (int u = 0; u < kPasses; ++u)
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (c0 + 32 * u < end) {
          Chunk<W>::load(w_rows[r], c0 + 32 * u, wv[u][r]);
        } else {
#pragma unroll
          for (int i = 0; i < kValues; ++i) wv[u][r][i] = 0.0f;
        }
      }
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      if (j >= n) break;
#pragma unroll
      for (int u = 0; u < kPasses; ++u) {
        if (c0 + 32 * u >= end) break;
        float xv[kValues];
        XChunk<X, W>::load(x + j * ld_x, c0 + 32 * u, xv);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
          for (int i = 0; i < kValues; ++i) acc[r][j] += wv[u][r][i] * xv[i];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      const float sum = warp_sum(acc[r][j]);
      if (lane == 0) partial[warp][r][j] = sum;
    }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kGemvRows * kTokens) {
    const int r = t / kTokens, j = t % kTokens;
    if (j < n && row0 + r < rows) {
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < kGemvWarps; ++v) sum += partial[v][r][j];
      y[j * ld_y + row0 + r] = sum;
    }
  }
}

template <int kTokens, typename X, typename W, int kRows>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const X* x, int n, int64_t ld_x, const W* w, int64_t rows,
                                                            int64_t cols, float* y, int64_t ld_y) {
  gemv_block<kTokens, X, W, kRows>(x, n, ld_x, w, rows, cols, y, ld_y, static_cast<int64_t>(blockIdx.x) * kRows);
}


// A batched product's output: the fp32 sum times alpha, kept in fp32 or rounded to bf16 once.
__device__ __forceinline__ void store_sum(float* y, float sum, float alpha) { *y = sum * alpha; }
__device__ __forceinline__ void store_sum(uint16_t* y, float sum, float alpha) { *y = float_to_bf16(sum * alpha); }

// Per-head products at decode sizes (the MLA absorption): for each b of `batch`,
// y_b[n, rows] = alpha * x_b[n, cols] . w_b^T, w_b [rows, cols] with leading dimension ld_w. A
// warp per output row (the rows are short: 512 values, two 16-byte chunks a lane), eight rows a
// block. Out: float or bf16 (uint16_t).
constexpr int kBatchedRowsPerBlock = kGemvThreads / 32;

template <int kTokens, typename Out>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_batched_rows_kernel(const uint16_t* x, int n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                             int64_t cols, int64_t ld_w, int64_t stride_w, Out* y, int64_t ld_y, int64_t stride_y,
                             float alpha) {
  chained_grid_prologue();
  const int64_t b = blockIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kBatchedRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint16_t* w_row = w + b * stride_w + row * ld_w;
  const uint16_t* x_b = x + b * stride_x;
  float acc[kTokens] = {};
  for (int64_t c = lane; c < cols / 8; c += 32) {
    float wv[8];
    widen8(__ldg(reinterpret_cast<const uint4*>(w_row) + c), wv);
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      if (j >= n) break;
      float xv[8];
      widen8(__ldg(reinterpret_cast<const uint4*>(x_b + j * ld_x) + c), xv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[j] += wv[i] * xv[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    const float sum = warp_sum(acc[j]);
    if (lane == 0 && j < n) store_sum(y + b * stride_y + j * ld_y + row, sum, alpha);
  }
}

// The other orientation: y_b[n, cols] = x_b[n, rows] . w_b, w_b [rows, cols]. Each thread owns
// eight adjacent columns (one 16-byte chunk; eight lanes read 128 contiguous bytes of a row) and
// the block's 32 row groups split the rows, summed through shared memory at the end. Narrow
// column tiles make many blocks (GLM's absorption: 8 per head, 512 in all), so that enough
// loads are in flight to stream the weights.
constexpr int kColumnChunksPerBlock = 8;
constexpr int kRowGroups = kGemvThreads / kColumnChunksPerBlock;

template <int kTokens, typename Out>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_batched_columns_kernel(const uint16_t* x, int n, int64_t ld_x, int64_t stride_x, const uint16_t* w,
                                int64_t rows, int64_t cols, int64_t ld_w, int64_t stride_w, Out* y, int64_t ld_y,
                                int64_t stride_y, float alpha) {
  chained_grid_prologue();
  __shared__ float partial[kRowGroups][kTokens][kColumnChunksPerBlock * 8];
  const int64_t b = blockIdx.y;
  const int chunk_in_block = threadIdx.x % kColumnChunksPerBlock, group = threadIdx.x / kColumnChunksPerBlock;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kColumnChunksPerBlock + chunk_in_block;
  const bool active = chunk < cols / 8;
  const uint16_t* w_b = w + b * stride_w;
  const uint16_t* x_b = x + b * stride_x;
  float acc[kTokens][8] = {};
  if (active) {
    // kRowsInFlight rows' loads are issued before any is used: one load at a time would make a
    // thread's walk over its rows a chain of memory latencies.
    constexpr int kRowsInFlight = 8;
    for (int64_t r0 = group; r0 < rows; r0 += int64_t{kRowGroups} * kRowsInFlight) {
      uint4 w_chunk[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t r = r0 + int64_t{u} * kRowGroups;
        if (r < rows) w_chunk[u] = __ldg(reinterpret_cast<const uint4*>(w_b + r * ld_w) + chunk);
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t r = r0 + int64_t{u} * kRowGroups;
        if (r >= rows) break;
        float wv[8];
        widen8(w_chunk[u], wv);
#pragma unroll
        for (int j = 0; j < kTokens; ++j) {
          if (j >= n) break;
          const float xv = bf16_to_float(x_b[j * ld_x + r]);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[j][i] += xv * wv[i];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) partial[group][j][chunk_in_block * 8 + i] = acc[j][i];
  __syncthreads();
  // kTokens x 64 sums of kRowGroups partials, one column of one token per thread and pass.
  for (int o = threadIdx.x; o < kTokens * kColumnChunksPerBlock * 8; o += kGemvThreads) {
    const int j = o / (kColumnChunksPerBlock * 8), col_in_block = o % (kColumnChunksPerBlock * 8);
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnChunksPerBlock * 8 + col_in_block;
    if (j >= n || col >= cols) continue;
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < kRowGroups; ++g) sum += partial[g][j][col_in_block];
    store_sum(y + b * stride_y + j * ld_y + col, sum, alpha);
  }
}

// launch(std::integral_constant<int, kTokens>) with kTokens 1, 2 or 4 (n <= 4).
template <typename Launch>
void dispatch_tokens(int64_t n, Launch launch) {
  if (n == 1) launch(std::integral_constant<int, 1>{});
  else if (n == 2) launch(std::integral_constant<int, 2>{});
  else launch(std::integral_constant<int, 4>{});
}

// One matrix: four rows a block, or one where four would leave SMs idle.
template <typename X, typename W>
void launch_gemv(const X* x, int64_t n, int64_t ld_x, const W* w, int64_t rows, int64_t cols, float* y, int64_t ld_y,
                 cudaStream_t stream) {
  const bool four = blocks_for(rows, kGemvRows) >= kMinBlocksForFourRows;
  dispatch_tokens(n, [&](auto tokens) {
    constexpr int kTokens = decltype(tokens)::value;
    if (four)
      launch_chained("gemv launch", gemv_kernel<kTokens, X, W, kGemvRows>, blocks_for(rows, kGemvRows), kGemvThreads, 0,
                     stream, x, static_cast<int>(n), ld_x, w, rows, cols, y, ld_y);
    else
      launch_chained("gemv launch", gemv_kernel<kTokens, X, W, 1>, static_cast<unsigned>(rows), kGemvThreads, 0, stream, x,
                     static_cast<int>(n), ld_x, w, rows, cols, y, ld_y);
  });
}

// Blocks [first_block[m], first_block[m + 1]) cover matrix m's rows.
struct GroupLaunch {
  const uint16_t* w[kGemvMaxGroup];
  int64_t rows[kGemvMaxGroup];
  float* y[kGemvMaxGroup];
  int64_t ld_y[kGemvMaxGroup];
  unsigned first_block[kGemvMaxGroup + 1];
  int count;
};

template <int kTokens>
__global__ void __launch_bounds__(kGemvThreads) gemv_group_kernel(const uint16_t* x, int n, int64_t ld_x, int64_t cols,
                                                                  GroupLaunch g) {
  int m = 0;
  while (m + 1 < g.count && blockIdx.x >= g.first_block[m + 1]) ++m;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - g.first_block[m]) * kGemvRows;
  gemv_block<kTokens, uint16_t, uint16_t>(x, n, ld_x, g.w[m], g.rows[m], cols, g.y[m], g.ld_y[m], row0);
}

}  // namespace

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Rows of x and w in whole 16-byte chunks, 16-byte aligned, 1 to kGemvMaxTokens tokens.
template <typename X, typename W>
bool gemv_fits(const X* x, int64_t n, int64_t ld_x, const W* w, int64_t cols) {
  constexpr int64_t kChunkW = 16 / sizeof(W), kChunkX = 16 / sizeof(X);  // values in 16 bytes
  return n >= 1 && n <= kGemvMaxTokens && cols % kChunkW == 0 && ld_x % kChunkX == 0 && aligned16(x) && aligned16(w);
}

// `name`'s launch: nothing for an empty product, an error for one gemv_fits refuses.
template <typename X, typename W>
void checked_gemv(const char* name, const X* x, int64_t n, int64_t ld_x, const W* w, int64_t rows, int64_t cols,
                  float* y, int64_t ld_y, cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  GLMS_CHECK(gemv_fits(x, n, ld_x, w, cols), std::string(name) + ": at most 4 tokens, 16-byte aligned rows");
  launch_gemv(x, n, ld_x, w, rows, cols, y, ld_y, stream);
}
}  // namespace

bool gemv_bf16_fits(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t cols) {
  return gemv_fits(x, n, ld_x, w, cols);
}

bool gemv_f32_fits(const float* x, int64_t n, int64_t ld_x, const float* w, int64_t cols) {
  return gemv_fits(x, n, ld_x, w, cols);
}

bool gemv_f32_bf16_fits(const float* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t cols) {
  return gemv_fits(x, n, ld_x, w, cols);
}

void gemv_bf16(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows, int64_t cols, float* y,
               int64_t ld_y, cudaStream_t stream) {
  checked_gemv("gemv_bf16", x, n, ld_x, w, rows, cols, y, ld_y, stream);
}

void gemv_f32(const float* x, int64_t n, int64_t ld_x, const float* w, int64_t rows, int64_t cols, float* y,
              int64_t ld_y, cudaStream_t stream) {
  checked_gemv("gemv_f32", x, n, ld_x, w, rows, cols, y, ld_y, stream);
}

void gemv_f32_bf16(const float* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                   int64_t ld_y, cudaStream_t stream) {
  checked_gemv("gemv_f32_bf16", x, n, ld_x, w, rows, cols, y, ld_y, stream);
}

void gemv_bf16_group(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs, int count,
                     cudaStream_t stream) {
  if (n == 0 || count == 0) return;
  GLMS_CHECK(count <= kGemvMaxGroup, "gemv_bf16_group: at most " + std::to_string(kGemvMaxGroup) + " matrices");
  GroupLaunch g{};
  g.count = count;
  for (int m = 0; m < count; ++m) {
    GLMS_CHECK(gemv_bf16_fits(x, n, ld_x, outputs[m].w, cols), "gemv_bf16_group: at most 4 tokens, aligned rows");
    g.w[m] = outputs[m].w;
    g.rows[m] = outputs[m].rows;
    g.y[m] = outputs[m].y;
    g.ld_y[m] = outputs[m].ld_y ? outputs[m].ld_y : outputs[m].rows;
    g.first_block[m + 1] = g.first_block[m] + blocks_for(outputs[m].rows, kGemvRows);
  }
  if (g.first_block[count] == 0) return;
  dispatch_tokens(n, [&](auto tokens) {
    launch_chained("gemv_group launch", gemv_group_kernel<decltype(tokens)::value>, g.first_block[count], kGemvThreads,
                   0, stream, x, static_cast<int>(n), ld_x, cols, g);
  });
}

bool gemv_bf16_batched_fits(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w,
                            int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w) {
  const bool w_ok = cols % 8 == 0 && ld_w % 8 == 0 && stride_w % 8 == 0 && aligned16(w);
  // Row-oriented products read x in 16-byte chunks too.
  const bool x_ok = transpose_w || (ld_x % 8 == 0 && stride_x % 8 == 0 && aligned16(x));
  return n >= 1 && n <= kGemvMaxTokens && w_ok && x_ok;
}

namespace {

template <typename Out>
void launch_gemv_batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                         int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, Out* y, int64_t ld_y,
                         int64_t stride_y, int batch, float alpha, cudaStream_t stream) {
  if (n == 0 || batch == 0 || rows == 0 || cols == 0) return;
  GLMS_CHECK(gemv_bf16_batched_fits(x, n, ld_x, stride_x, w, cols, ld_w, stride_w, transpose_w),
             "gemv_bf16_batched: at most 4 tokens, 16-byte aligned rows");
  dispatch_tokens(n, [&](auto tokens) {
    constexpr int kTokens = decltype(tokens)::value;
    if (transpose_w) {
      const dim3 grid(blocks_for(cols / 8, kColumnChunksPerBlock), batch);
      launch_chained("gemv_batched_columns launch", gemv_batched_columns_kernel<kTokens, Out>, grid, kGemvThreads, 0,
                     stream, x, static_cast<int>(n), ld_x, stride_x, w, rows, cols, ld_w, stride_w, y, ld_y, stride_y,
                     alpha);
    } else {
      const dim3 grid(blocks_for(rows, kBatchedRowsPerBlock), batch);
      launch_chained("gemv_batched_rows launch", gemv_batched_rows_kernel<kTokens, Out>, grid, kGemvThreads, 0, stream,
                     x, static_cast<int>(n), ld_x, stride_x, w, rows, cols, ld_w, stride_w, y, ld_y, stride_y, alpha);
    }
  });
}

}  // namespace

void gemv_bf16_batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                       int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, float* y, int64_t ld_y,
                       int64_t stride_y, int batch, cudaStream_t stream) {
  launch_gemv_batched(x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w, transpose_w, y, ld_y, stride_y, batch, 1.0f,
                      stream);
}

void gemv_bf16_batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                       int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, uint16_t* y, int64_t ld_y,
                       int64_t stride_y, int batch, cudaStream_t stream, float alpha) {
  launch_gemv_batched(x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w, transpose_w, y, ld_y, stride_y, batch, alpha,
                      stream);
}

}  // namespace glms::ops::cuda

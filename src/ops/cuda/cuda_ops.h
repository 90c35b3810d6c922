// The CUDA backend's basics: device and pinned buffers, streams, events and graphs, the
// elementwise kernels of the CUDA forward pass (norms, RoPE, SwiGLU, cache writes, fills) and
// the cuBLAS GEMMs. Functions take device pointers, enqueue on `stream`, and check every CUDA
// call (a failure throws glms::Error naming the call). Parity with ops/cpu is tested in
// tests/ops/test_cuda_ops.cpp. Attention, indexer and MoE kernels have their own headers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

// Number of CUDA devices visible (0 when no driver or no GPU: callers skip).
int device_count();

// The calling thread's current device (a rank's worker sets its own before making anything).
void set_device(int device);
int current_device();
// A visible device's model: its name and compute capability (model/cuda_support.h says which
// run glmserve's kernels).
struct GpuModel {
  std::string name;
  int major = 0, minor = 0;
};
GpuModel gpu_model(int device);

// Streaming multiprocessors of the current device (read once per process: every rank's GPU is
// the same model).
int multiprocessor_count();

// Throws glms::Error("<what>: <CUDA error string>") unless `status` is cudaSuccess.
void check(int status, const char* what);

// A device allocation (cudaMalloc), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A device allocation of `bytes` bytes, every one 0 before it returns.
DeviceBuffer zeroed_buffer(size_t bytes);

// An owned CUDA stream.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory (so that copies on a stream are truly asynchronous).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

void copy_to_device_async(void* device, const void* host, size_t bytes, cudaStream_t stream);
void copy_to_host_async(void* host, const void* device, size_t bytes, cudaStream_t stream);
void copy_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void memset_async(void* device, int value, size_t bytes, cudaStream_t stream);

// A captured sequence of stream work, replayed with one launch (CUDA graphs).
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture(cudaStream_t stream);
  void end_capture(cudaStream_t stream);  // instantiates
  void launch(cudaStream_t stream) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// A point in a stream's work, for timing it on the device.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const Event& start) const;
  // Work queued on `stream` from now on waits for this event's (inside a graph capture: an edge
  // from the recording stream's branch).
  void make_wait(cudaStream_t stream) const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

// Waits for all work on the device.
void synchronize_device();

// Free and total device memory in bytes.
std::pair<size_t, size_t> memory_info();
// cudaProfilerStart / cudaProfilerStop: brackets the work a profiler started with
// "--profile-from-start off" (ncu) records.
void profiler_range(bool start);

// Waits for the work queued on `stream` (one that is not ours to own).
void synchronize_stream(cudaStream_t stream);

// What a one-GPU rank simulation's all-gathers bring in, in one launch (as a group call of real
// collectives is one): each part's `bytes` (a multiple of 4) from `send` into each of `slots`
// consecutive slots of `recv`. Parts with `shift_experts` hold int32 expert ids: slot s receives
// (id + s_rel * num_experts / slots) mod num_experts, s_rel = (s - rank) mod slots, -1 kept, so
// the stand-in peers' tokens choose other experts, as a real peer's would.
struct SimulatedGatherPart {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t bytes = 0;
  bool shift_experts = false;
};
constexpr int kMaxSimulatedGatherParts = 4;
void simulated_all_gather(const SimulatedGatherPart* parts, int num_parts, int slots, int rank, int num_experts,
                          cudaStream_t stream);

// out[i] = a[i] + b[i] for `count` fp32 values (out may be a or b).
void add_f32(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream);

// out[r] = the index of the largest of x[r, 0..cols) (lowest index on ties, NaN never chosen;
// 0 when no value compares), as ops::argmax: greedy decoding's token for each logits row.
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream);
// One logits row's draw (sampling.cu): ops::SamplingFilter's fields (temperature > 0) and the
// uniform value in [0, 1) that picks the token.
struct RowSampling {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double canonical = 0.0;
};
// out[r] = ops::sample_row(x[row_of[r]], cols, params[r]'s filter, params[r].canonical) for r <
// rows (row_of null: row r; row_of, params and out on the device), but for rounding where a
// cumulative mass lands exactly on a boundary. blocks_per_row (1, 2, 4 or 8): the blocks that
// share a row, a thread block cluster (Hopper) when more than one; one block's passes over a
// 154880-id row take about 0.45 ms on an H200.
void sample_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_of, const RowSampling* params,
                 int32_t* out, cudaStream_t stream, int blocks_per_row = 1);
// Structured-output token masks (token_mask.cu): for each m < count, x[rows[m], t] = -infinity
// for every t < cols whose bit t % 32 of masks[m * words + t / 32] is clear (words = (cols + 31)
// / 32); set bits leave x untouched, bit for bit. x: [.., cols] fp32; rows: [count] (null: row m),
// masks: [count, words]; all on the device. Other rows are not touched. Runs before argmax_rows
// and sample_rows read the rows.
void apply_token_masks(float* x, int64_t cols, const int32_t* rows, const uint32_t* masks, int64_t count,
                       cudaStream_t stream);

// RoPE on `n * heads` rows of `x` (row r belongs to token r / heads): the `rope_dim` values at
// column `offset` of each `row_stride`-wide row rotate by positions[token] * inv_freq.
void rope_rows(float* x, int64_t n, int heads, int64_t row_stride, int64_t offset, int rope_dim,
               const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// out[i, :] = src[rows[i] / divisor, :] for i < n (bf16 rows of `dim`).
void gather_rows(const uint16_t* src, int64_t dim, const int32_t* rows, int64_t n, int divisor, uint16_t* out,
                 cudaStream_t stream);

// x[t, :] = table[ids[t], :] widened to fp32. table: [vocab, dim] bf16, x: [n, dim] fp32.
void embed_rows(const uint16_t* table, const int32_t* ids, int64_t n, int64_t dim, float* x, cudaStream_t stream);

// Rows as E4M3 codes with one fp32 scale a row and 128 columns, as quantize_fp8_rows writes them
// (linear_fp8.h): for n rows of `cols` and np = fp8_padded_tokens(n), codes [np, cols] and scales
// [cols / 128][np], the pad rows' codes 0 and scales 1.
struct Fp8Rows {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};

// The residual step between blocks: x += delta (when delta is not null; x += (delta + addend)
// when addend is not null too: a block output left in two parts), then y = rms_norm(x) * weight
// into y_f32 and/or y_bf16 (either may be null). x, delta, addend, y_*: [n, dim]. With
// y_low_terms ([2, n, dim] bf16; y_bf16 required) y is also split into core/bf16_terms.h's three
// bf16 terms: y_bf16 is its term 0 and y_low_terms its terms 1 and 2, the fp32-accurate router's
// input (Gemm::linear_f32_terms) without the fp32 rows. delta_bf16 (delta null): the delta as
// bf16 rows (a data-parallel rank's reduce-scattered MoE sums), widened as read. y_fp8 (codes
// set; y_bf16 required, dim a multiple of 128): y_bf16's rows also as E4M3 rows, the codes and
// scales quantize_fp8_rows(y_bf16) would make, so that an FP8 GEMM reads them without a pass of
// its own.
void residual_rms_norm(float* x, const float* delta, int64_t n, int64_t dim, const float* weight, float eps,
                       float* y_f32, uint16_t* y_bf16, cudaStream_t stream, const float* addend = nullptr,
                       uint16_t* y_low_terms = nullptr, const uint16_t* delta_bf16 = nullptr, Fp8Rows y_fp8 = {});

// out[t, i] = bf16(silu(gate_up[t, i]) * gate_up[t, inter + i]): gate and up side by side,
// as the fused gate||up GEMM writes them. gate_up: [n, 2 * inter] fp32, out: [n, inter] bf16.
// out_fp8 (codes set; inter a multiple of 128): out's rows also as E4M3 rows, as
// quantize_fp8_rows(out) would make them; out may then be null (the E4M3 rows only).
void silu_mul_to_bf16(const float* gate_up, int64_t n, int64_t inter, uint16_t* out, cudaStream_t stream,
                      Fp8Rows out_fp8 = {});
// The same from bf16 gate and up values (a bf16 GEMM's output, as transformers' bf16 MLP has them).
void silu_mul_to_bf16(const uint16_t* gate_up, int64_t n, int64_t inter, uint16_t* out, cudaStream_t stream,
                      Fp8Rows out_fp8 = {});

// out[i] = x[i] widened to fp32.
void widen_bf16(const uint16_t* x, int64_t count, float* out, cudaStream_t stream);
// out[i] = x[i] rounded to bf16 (to nearest even).
void round_to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream);

// Deterministic pseudo-random fill (a counter hash of `seed` and the index): uniform in
// [-scale, scale] for bf16 or fp32, or the constant `value`.
void fill_uniform_bf16(uint16_t* out, int64_t count, uint64_t seed, float scale, cudaStream_t stream);
void fill_uniform_f32(float* out, int64_t count, uint64_t seed, float scale, cudaStream_t stream);
void fill_f32(float* out, int64_t count, float value, cudaStream_t stream);
// Quantised fills: E4M3 codes of values uniform in [-448, 448]; bytes uniform in [0, 256)
// (MXFP4 nibbles: every E2M1 code equally likely); a constant byte (E8M0 scales).
void fill_uniform_e4m3(uint8_t* out, int64_t count, uint64_t seed, cudaStream_t stream);
void fill_random_bytes(uint8_t* out, int64_t count, uint64_t seed, cudaStream_t stream);
void fill_bytes(uint8_t* out, int64_t count, uint8_t value, cudaStream_t stream);

// Dense GEMMs through cuBLAS with fp32 accumulation, over row-major matrices with explicit
// leading dimensions (elements between rows; 0 means dense). One handle per object.
// Weight-streaming bf16 GEMV for 1 to kGemvMaxTokens tokens (gemv.cu): y[n, rows] (fp32, row
// stride ld_y) = x[n, cols] (bf16, row stride ld_x) . w[rows, cols]^T. gemv_bf16_fits says
// whether the shapes and 16-byte alignment allow it.
inline constexpr int kGemvMaxTokens = 4;
bool gemv_bf16_fits(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t cols);
void gemv_bf16(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows, int64_t cols, float* y,
               int64_t ld_y, cudaStream_t stream);
// The same over fp32 x and w (the MoE router).
bool gemv_f32_fits(const float* x, int64_t n, int64_t ld_x, const float* w, int64_t cols);
void gemv_f32(const float* x, int64_t n, int64_t ld_x, const float* w, int64_t rows, int64_t cols, float* y,
              int64_t ld_y, cudaStream_t stream);
// fp32 x against bf16 w (a router whose weights are bf16 values, as GLM-5's are): the same fp32
// products as gemv_f32 over the widened weights, from half the bytes.
bool gemv_f32_bf16_fits(const float* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t cols);
void gemv_f32_bf16(const float* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                   int64_t ld_y, cudaStream_t stream);
// Up to kGemvMaxGroup bf16 matrices of `cols` columns that read the same x, in one launch:
// outputs[m].y[n, rows_m] (row stride ld_y, 0: rows_m) = x . outputs[m].w^T.
inline constexpr int kGemvMaxGroup = 4;
struct GemvOutput {
  const uint16_t* w = nullptr;  // [rows, cols] bf16
  int64_t rows = 0;
  float* y = nullptr;
  int64_t ld_y = 0;
};
void gemv_bf16_group(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs, int count,
                     cudaStream_t stream);
// The same for 1 to kSkinnyMaxTokens tokens on the tensor cores (linear_skinny.cu): the weights
// streamed once, k split over a thread block cluster where the row tiles are few, fp32 sums added
// in a fixed order. linear_skinny_fits says whether the shapes and alignment allow it (cols a
// multiple of 64, x and each w 16-byte aligned, ld_x a multiple of 8) and whether it pays: at
// most kSkinnyMaxWaves blocks an SM of 64-row tiles (beyond, as for lm_head, cuBLAS streams the
// weights as fast).
inline constexpr int kSkinnyMaxTokens = 128;
inline constexpr int kSkinnyMaxWaves = 3;
bool linear_skinny_fits(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs,
                        int count);
void linear_skinny(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs, int count,
                   cudaStream_t stream);

// `batch` independent small products at decode sizes (Gemm::batched's contract, n <= 4): per b,
// transpose_w false: y_b[n, rows] = x_b[n, cols] . w_b^T; true: y_b[n, cols] = x_b[n, rows] . w_b.
// With a bf16 y, each fp32 sum times alpha is rounded once (Gemm::batched_to_bf16's contract).
bool gemv_bf16_batched_fits(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w,
                            int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w);
void gemv_bf16_batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                       int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, float* y, int64_t ld_y,
                       int64_t stride_y, int batch, cudaStream_t stream);
void gemv_bf16_batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                       int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, uint16_t* y, int64_t ld_y,
                       int64_t stride_y, int batch, cudaStream_t stream, float alpha);

// One product of a grouped GEMM: y[n, rows] (fp32) = x[n, cols] (bf16) . w[rows, cols]^T (bf16),
// rows dense; every product of a group shares rows and cols.
struct GroupedProduct {
  const uint16_t* x = nullptr;
  int64_t n = 0;
  const uint16_t* w = nullptr;
  float* y = nullptr;
};

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[n, rows] (fp32) = x[n, cols] (bf16) . w[rows, cols]^T (bf16). n up to the small-batch
  // GEMV's token count goes through gemv_bf16 where it fits, n up to the skinny GEMM's through
  // linear_skinny where it fits, else cuBLAS.
  void linear(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
              cudaStream_t stream, int64_t ld_x = 0, int64_t ld_y = 0);
  // The same product with y in bf16 (each fp32 sum rounded to nearest even once, as f32_to_bf16
  // of linear's y), through cuBLAS whatever n: for prefill-sized n, whose fp32 rows would only be
  // converted afterwards.
  void linear_to_bf16(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, uint16_t* y,
                      cudaStream_t stream);
  // y ([n, rows] fp32) += x . w^T in the GEMM's epilogue (cuBLAS, beta 1) whatever n: for a
  // prefill's block output added straight into the residual stream, which would otherwise be
  // written apart and read again by the next norm.
  void linear_accumulate(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                         cudaStream_t stream);
  // Linear layers of at most `max_tokens` (<= kGemvMaxTokens) tokens through gemv_bf16; 0: cuBLAS only.
  void set_small_batch_gemv(int max_tokens) { gemv_max_tokens_ = std::clamp(max_tokens, 0, kGemvMaxTokens); }
  // Linear layers of more tokens than the GEMV takes, up to `max_tokens` (<= kSkinnyMaxTokens),
  // through linear_skinny where it fits, and linear_group's groups of several matrices up to
  // `max_group_tokens`; 0: cuBLAS.
  void set_skinny_gemm(int max_tokens, int max_group_tokens) {
    skinny_max_tokens_ = std::clamp(max_tokens, 0, kSkinnyMaxTokens);
    skinny_max_group_tokens_ = std::clamp(max_group_tokens, 0, kSkinnyMaxTokens);
  }
  // Products of different x, w and n but the same rows and cols (a MoE layer's experts over
  // their grouped tokens) in one cuBLAS grouped GEMM call (cublasGemmGroupedBatchedEx), or one
  // GEMM each where cuBLAS declines the call. Synchronises the stream (the problem sizes and the
  // pointer arrays are staged from the host), so not for graph capture.
  void linear_grouped(const GroupedProduct* products, int count, int64_t rows, int64_t cols, cudaStream_t stream);
  // Several products of the same x (bf16, dense rows of `cols`): one grouped GEMV launch where
  // the small-batch GEMV applies, else one skinny GEMM launch where that does, else one GEMM each.
  void linear_group(const uint16_t* x, int64_t n, int64_t cols, const GemvOutput* outputs, int count,
                    cudaStream_t stream);
  // The same in fp32 throughout (the MoE router, whose scores stay fp32): gemv_f32 up to the
  // small-batch GEMV's token count, else cuBLAS. With `tf32`, cuBLAS runs the products on tensor
  // cores with inputs rounded to TF32 (10-bit mantissa), fp32 sums.
  void linear_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y,
                  cudaStream_t stream, bool tf32 = false);
  // The same product for bf16 weights w on the bf16 tensor cores, x given as its bf16 terms
  // (core/bf16_terms.h; term 0 [n, cols], terms 1 and 2 [2, n, cols], as residual_rms_norm writes
  // them): y = sum over k of term k . w^T, three cuBLAS GEMMs adding into y in fp32. Every product
  // is exact in fp32; the tensor cores' fp32 sums truncate, so y is within a few 1e-6 (relative
  // L2) of linear_f32 for the widened weights (whose own error is a few 1e-7), in a fraction of
  // its time (fp32 GEMMs run on the CUDA cores).
  void linear_f32_terms(const uint16_t* term0, const uint16_t* low_terms, int64_t n, const uint16_t* w, int64_t rows,
                        int64_t cols, float* y, cudaStream_t stream);
  // `batch` independent bf16 products, operand b at x + b * stride_x, w + b * stride_w,
  // y + b * stride_y. transpose_w false: y[n, rows] = x[n, cols] . w^T;
  // true: y[n, cols] = x[n, rows] . w. w is [rows, cols] with leading dimension ld_w. Up to the
  // small-batch GEMV's token count through gemv_bf16_batched where it fits, else cuBLAS.
  void batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
               int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, float* y, int64_t ld_y,
               int64_t stride_y, int batch, cudaStream_t stream);
  // The same with y in bf16: each fp32 sum (times alpha) rounded to nearest even once, as the
  // CPU's f32_to_bf16 of batched's y would round it, without the fp32 rows in memory; the same
  // kernels as batched.
  void batched_to_bf16(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                       int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, uint16_t* y, int64_t ld_y,
                       int64_t stride_y, int batch, cudaStream_t stream, float alpha = 1.0f);

 private:
  void* handle_ = nullptr;     // cublasHandle_t
  void* workspace_ = nullptr;  // cuBLAS workspace of our own, so that GEMMs can be graph-captured
  void* grouped_pointers_ = nullptr;  // device [3, grouped_capacity_] A, B, C pointers of linear_grouped
  void* grouped_staging_ = nullptr;   // pinned host copy of the same
  int grouped_capacity_ = 0;
  int gemv_max_tokens_ = 0;
  int skinny_max_tokens_ = 0;
  int skinny_max_group_tokens_ = 0;
};

}  // namespace glms::ops::cuda

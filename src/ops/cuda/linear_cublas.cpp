// Dense GEMMs through cuBLAS. Row-major y[n, rows] = x[n, cols] . W^T is, in cuBLAS's
// column-major terms, Y^T[rows, n] = op_T(W^T)[rows, cols] . X^T[cols, n]: W's row-major
// storage is W^T column-major with leading dimension ld_w, and X's is X^T with ld ld_x.
// y = x . W (W not transposed) is Y^T = W^T . X^T with op_N on both.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

namespace {
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(std::string(what) + ": cuBLAS status " + std::to_string(status));
}
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

int narrow(int64_t v) {
  GLMS_CHECK(v >= 0 && v <= 0x7fffffff, "GEMM dimension out of cuBLAS's int range");
  return static_cast<int>(v);
}

// y[n, rows] = x[n, cols] . w^T + beta y through cublasGemmEx: bf16 x (rows ld_x apart) and w,
// fp32 sums, y of y_type (fp32, or bf16 rounded once) with rows ld_y apart.
void bf16_gemm(cublasHandle_t handle, const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows,
               int64_t cols, float beta, void* y, cudaDataType_t y_type, int64_t ld_y, cudaStream_t stream,
               const char* what) {
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, narrow(rows), narrow(n), narrow(cols), &alpha, w,
                            CUDA_R_16BF, narrow(cols), x, CUDA_R_16BF, narrow(ld_x), &beta, y, y_type, narrow(ld_y),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               what);
}
}  // namespace

Gemm::Gemm() {
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  handle_ = handle;
  check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLAS workspace)");
  check_cublas(cublasSetWorkspace(handle, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
  if (grouped_pointers_) cudaFree(grouped_pointers_);
  if (grouped_staging_) cudaFreeHost(grouped_staging_);
}

void Gemm::linear_grouped(const GroupedProduct* products, int count, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (count == 0 || rows == 0) return;
  if (count > grouped_capacity_) {
    if (grouped_pointers_) cudaFree(grouped_pointers_);
    if (grouped_staging_) cudaFreeHost(grouped_staging_);
    grouped_pointers_ = grouped_staging_ = nullptr;
    grouped_capacity_ = 0;
    check(cudaMalloc(&grouped_pointers_, sizeof(void*) * 3 * count), "cudaMalloc (grouped GEMM pointers)");
    check(cudaMallocHost(&grouped_staging_, sizeof(void*) * 3 * count), "cudaMallocHost (grouped GEMM pointers)");
    grouped_capacity_ = count;
  }
  // Each product is a group of one: in column-major terms y^T[rows, n] = op_T(w)[rows, cols] . x^T.
  std::vector<cublasOperation_t> trans_w(count, CUBLAS_OP_T), trans_x(count, CUBLAS_OP_N);
  std::vector<int> m(count, narrow(rows)), n(count), k(count, narrow(cols)), lda(count, narrow(cols)),
      ldb(count, narrow(cols)), ldc(count, narrow(rows)), group_size(count, 1);
  std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  auto** staged = static_cast<const void**>(grouped_staging_);
  for (int i = 0; i < count; ++i) {
    n[i] = narrow(products[i].n);
    staged[i] = products[i].w;
    staged[count + i] = products[i].x;
    staged[2 * count + i] = products[i].y;
  }
  check(cudaMemcpyAsync(grouped_pointers_, grouped_staging_, sizeof(void*) * 3 * count, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (grouped GEMM pointers)");
  auto handle = static_cast<cublasHandle_t>(handle_);
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  auto** device = static_cast<void**>(grouped_pointers_);
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      handle, trans_w.data(), trans_x.data(), m.data(), n.data(), k.data(), alpha.data(), device, CUDA_R_16BF,
      lda.data(), device + count, CUDA_R_16BF, ldb.data(), beta.data(), device + 2 * count, CUDA_R_32F, ldc.data(),
      count, group_size.data(), CUBLAS_COMPUTE_32F);
  // The staging buffer is rewritten by the next call: wait for this call's copy (and GEMMs).
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (grouped GEMM)");
  if (status == CUBLAS_STATUS_SUCCESS) return;
  GLMS_CHECK(status == CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmGroupedBatchedEx: cuBLAS status " + std::to_string(status));
  for (int i = 0; i < count; ++i) linear(products[i].x, products[i].n, products[i].w, rows, cols, products[i].y, stream);
}

void Gemm::linear(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                  cudaStream_t stream, int64_t ld_x, int64_t ld_y) {
  if (n == 0 || rows == 0) return;
  if (n <= gemv_max_tokens_ && gemv_bf16_fits(x, n, ld_x ? ld_x : cols, w, cols)) {
    gemv_bf16(x, n, ld_x ? ld_x : cols, w, rows, cols, y, ld_y ? ld_y : rows, stream);
    return;
  }
  const GemvOutput output{w, rows, y, ld_y};
  const int64_t x_stride = ld_x ? ld_x : cols;
  if (n > gemv_max_tokens_ && n <= skinny_max_tokens_ && linear_skinny_fits(x, n, x_stride, cols, &output, 1)) {
    linear_skinny(x, n, x_stride, cols, &output, 1, stream);
    return;
  }
  bf16_gemm(static_cast<cublasHandle_t>(handle_), x, n, x_stride, w, rows, cols, 0.0f, y, CUDA_R_32F,
            ld_y ? ld_y : rows, stream, "cublasGemmEx (bf16 linear)");
}

void Gemm::linear_to_bf16(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, uint16_t* y,
                          cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  bf16_gemm(static_cast<cublasHandle_t>(handle_), x, n, cols, w, rows, cols, 0.0f, y, CUDA_R_16BF, rows, stream,
            "cublasGemmEx (bf16 linear, bf16 out)");
}

void Gemm::linear_accumulate(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                             cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  bf16_gemm(static_cast<cublasHandle_t>(handle_), x, n, cols, w, rows, cols, 1.0f, y, CUDA_R_32F, rows, stream,
            "cublasGemmEx (bf16 linear, accumulated)");
}

void Gemm::linear_group(const uint16_t* x, int64_t n, int64_t cols, const GemvOutput* outputs, int count,
                        cudaStream_t stream) {
  bool grouped = n <= gemv_max_tokens_ && count <= kGemvMaxGroup;
  for (int m = 0; m < count && grouped; ++m) grouped = gemv_bf16_fits(x, n, cols, outputs[m].w, cols);
  if (grouped) {
    gemv_bf16_group(x, n, cols, cols, outputs, count, stream);
    return;
  }
  const int skinny_tokens = count > 1 ? skinny_max_group_tokens_ : skinny_max_tokens_;
  if (n > gemv_max_tokens_ && n <= skinny_tokens && linear_skinny_fits(x, n, cols, cols, outputs, count)) {
    linear_skinny(x, n, cols, cols, outputs, count, stream);
    return;
  }
  for (int m = 0; m < count; ++m)
    linear(x, n, outputs[m].w, outputs[m].rows, cols, outputs[m].y, stream, 0, outputs[m].ld_y);
}

void Gemm::linear_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y,
                      cudaStream_t stream, bool tf32) {
  if (n == 0 || rows == 0) return;
  if (n <= gemv_max_tokens_ && gemv_f32_fits(x, n, cols, w, cols)) {
    gemv_f32(x, n, cols, w, rows, cols, y, rows, stream);
    return;
  }
  auto handle = static_cast<cublasHandle_t>(handle_);
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, narrow(rows), narrow(n), narrow(cols), &alpha, w,
                            CUDA_R_32F, narrow(cols), x, CUDA_R_32F, narrow(cols), &beta, y, CUDA_R_32F, narrow(rows),
                            tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (fp32 linear)");
}

void Gemm::linear_f32_terms(const uint16_t* term0, const uint16_t* low_terms, int64_t n, const uint16_t* w,
                            int64_t rows, int64_t cols, float* y, cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  const uint16_t* const planes[3] = {term0, low_terms, low_terms + n * cols};
  for (int k = 0; k < 3; ++k)
    bf16_gemm(static_cast<cublasHandle_t>(handle_), planes[k], n, cols, w, rows, cols, k == 0 ? 0.0f : 1.0f, y,
              CUDA_R_32F, rows, stream, "cublasGemmEx (bf16 terms of an fp32 linear)");
}

namespace {

// y[b] = alpha * x[b] W[b]^T (W[b] itself with transpose_w) for b < batch, bf16 inputs, fp32 sums,
// y of `y_type` (fp32, or bf16 rounded once): Gemm::batched's cuBLAS call.
void strided_batched(cublasHandle_t handle, const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x,
                     const uint16_t* w, int64_t rows, int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w,
                     void* y, cudaDataType_t y_type, int64_t ld_y, int64_t stride_y, int batch, cudaStream_t stream,
                     float alpha) {
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const float beta = 0.0f;
  const int64_t out_dim = transpose_w ? cols : rows, in_dim = transpose_w ? rows : cols;
  check_cublas(cublasGemmStridedBatchedEx(handle, transpose_w ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N,
                                          narrow(out_dim), narrow(n), narrow(in_dim), &alpha, w, CUDA_R_16BF,
                                          narrow(ld_w), stride_w, x, CUDA_R_16BF, narrow(ld_x), stride_x, &beta, y,
                                          y_type, narrow(ld_y), stride_y, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
               y_type == CUDA_R_16BF ? "cublasGemmStridedBatchedEx (bf16 out)" : "cublasGemmStridedBatchedEx (bf16)");
}

}  // namespace

void Gemm::batched(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w, int64_t rows,
                   int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, float* y, int64_t ld_y,
                   int64_t stride_y, int batch, cudaStream_t stream) {
  if (n == 0 || batch == 0) return;
  if (n <= gemv_max_tokens_ && gemv_bf16_batched_fits(x, n, ld_x, stride_x, w, cols, ld_w, stride_w, transpose_w)) {
    gemv_bf16_batched(x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w, transpose_w, y, ld_y, stride_y, batch,
                      stream);
    return;
  }
  strided_batched(static_cast<cublasHandle_t>(handle_), x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w,
                  transpose_w, y, CUDA_R_32F, ld_y, stride_y, batch, stream, 1.0f);
}

void Gemm::batched_to_bf16(const uint16_t* x, int64_t n, int64_t ld_x, int64_t stride_x, const uint16_t* w,
                           int64_t rows, int64_t cols, int64_t ld_w, int64_t stride_w, bool transpose_w, uint16_t* y,
                           int64_t ld_y, int64_t stride_y, int batch, cudaStream_t stream, float alpha) {
  if (n == 0 || batch == 0) return;
  if (n <= gemv_max_tokens_ && gemv_bf16_batched_fits(x, n, ld_x, stride_x, w, cols, ld_w, stride_w, transpose_w)) {
    gemv_bf16_batched(x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w, transpose_w, y, ld_y, stride_y, batch,
                      stream, alpha);
    return;
  }
  strided_batched(static_cast<cublasHandle_t>(handle_), x, n, ld_x, stride_x, w, rows, cols, ld_w, stride_w,
                  transpose_w, y, CUDA_R_16BF, ld_y, stride_y, batch, stream, alpha);
}

}  // namespace glms::ops::cuda

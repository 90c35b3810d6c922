// Fp8Gemm: row-major y[n, rows] = x[n, cols] . W^T is, in cuBLASLt's column-major terms,
// Y^T[rows, n] = op_T(A)[rows, cols] . B[cols, n] with A = W's storage (W^T column-major,
// ld = cols) and B = x's (X^T column-major, ld = cols): the "TN" form FP8 tensor cores take.
// The weight is operand A with 128 x 128 block scales, the activations operand B with
// per-token scales of 128 columns.
#include "ops/cuda/linear_fp8.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(std::string(what) + ": cuBLASLt status " + std::to_string(status));
}
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

std::vector<float> fp8_weight_scales_for_cublaslt(const float* scale_inv, int64_t rows, int64_t cols) {
  const int64_t row_blocks = (rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t col_blocks = (cols + kFp8ScaleBlock - 1) / kFp8ScaleBlock, padded = (col_blocks + 3) / 4 * 4;
  std::vector<float> out(static_cast<size_t>(row_blocks * padded), 0.0f);
  for (int64_t r = 0; r < row_blocks; ++r)
    for (int64_t c = 0; c < col_blocks; ++c) out[r * padded + c] = scale_inv[r * col_blocks + c];
  return out;
}

// The matmul descriptor (its scale pointers are set per call), the layouts and the algorithm of
// one shape.
struct Fp8Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Fp8Gemm::Fp8Gemm() {
  cublasLtHandle_t handle = nullptr;
  check_lt(cublasLtCreate(&handle), "cublasLtCreate");
  handle_ = handle;
  check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [shape, plan] : plans_) delete plan;
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
}

Fp8Gemm::Plan& Fp8Gemm::plan(int64_t n, int64_t rows, int64_t cols, bool bf16_output) {
  const auto key = std::make_tuple(n, rows, cols, bf16_output);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto* p = new Plan;
  try {
    check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)), "TRANSB");
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)),
             "A_SCALE_MODE");
    check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)),
             "B_SCALE_MODE");
    check_lt(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, cols, rows, cols), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, cols, n, cols), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&p->d, bf16_output ? CUDA_R_16BF : CUDA_R_32F, rows, n, rows), "layout D");
    cublasLtMatmulPreference_t preference = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const size_t workspace = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    // The scale pointers take part in no heuristic; any 16-byte aligned value stands in.
    const void* placeholder = workspace_;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder, sizeof(placeholder));
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder, sizeof(placeholder));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a, p->b, p->d, p->d,
                                       preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("Fp8Gemm: cuBLASLt has no block-scaled FP8 algorithm for " + std::to_string(n) + " x " +
           std::to_string(rows) + " x " + std::to_string(cols) + (bf16_output ? " with bf16 outputs" : "") +
           " (status " + std::to_string(status) + "); it needs a Hopper GPU and cuBLAS 12.9 or later");
    p->algo = result.algo;
  } catch (...) {
    delete p;
    throw;
  }
  plans_[key] = p;
  return *p;
}

void Fp8Gemm::run(Plan& p, const uint8_t* x_codes, const float* x_scales, const uint8_t* w_codes,
                  const float* w_scales, void* y, float beta, cudaStream_t stream) {
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)),
           "A_SCALE_POINTER");
  check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)),
           "B_SCALE_POINTER");
  const float alpha = 1.0f;
  check_lt(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w_codes, p.a, x_codes, p.b, &beta, y,
                          p.d, y, p.d, &p.algo, workspace_, kWorkspaceBytes, stream),
           "cublasLtMatmul (block-scaled FP8)");
}

void Fp8Gemm::linear(const uint8_t* x_codes, const float* x_scales, int64_t n, const uint8_t* w_codes,
                     const float* w_scales, int64_t rows, int64_t cols, float* y, cudaStream_t stream,
                     bool accumulate) {
  if (n == 0 || rows == 0) return;
  GLMS_CHECK(cols % kFp8ScaleBlock == 0 && rows % 16 == 0,
             "Fp8Gemm: cols a multiple of 128 and rows a multiple of 16");
  run(plan(fp8_padded_tokens(n), rows, cols, false), x_codes, x_scales, w_codes, w_scales, y, accumulate ? 1.0f : 0.0f,
      stream);
}

bool Fp8Gemm::has_bf16_output(int64_t n, int64_t rows, int64_t cols) {
  const auto key = std::make_tuple(fp8_padded_tokens(n), rows, cols);
  if (auto it = bf16_output_.find(key); it != bf16_output_.end()) return it->second;
  bool found = true;
  try {
    plan(std::get<0>(key), rows, cols, true);
  } catch (const Error&) {
    found = false;
  }
  return bf16_output_[key] = found;
}

void Fp8Gemm::linear_to_bf16(const uint8_t* x_codes, const float* x_scales, int64_t n, const uint8_t* w_codes,
                             const float* w_scales, int64_t rows, int64_t cols, uint16_t* y, cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  GLMS_CHECK(cols % kFp8ScaleBlock == 0 && rows % 16 == 0,
             "Fp8Gemm: cols a multiple of 128 and rows a multiple of 16");
  run(plan(fp8_padded_tokens(n), rows, cols, true), x_codes, x_scales, w_codes, w_scales, y, 0.0f, stream);
}

}  // namespace glms::ops::cuda

// bf16 GEMM through cuBLAS. Row-major y[n, rows] = x[n, cols] . W^T is, in cuBLAS's
// column-major terms, Y^T[rows, n] = op_T(W^T)[rows, cols] . X^T[cols, n]: W's row-major
// storage is W^T column-major with leading dimension cols, and X's is X^T with ld cols.
#include <cublas_v2.h>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

namespace {
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(std::string(what) + ": cuBLAS status " + std::to_string(status));
}
}  // namespace

Bf16Linear::Bf16Linear() {
  cublasHandle_t handle = nullptr;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  handle_ = handle;
}

Bf16Linear::~Bf16Linear() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void Bf16Linear::run(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
                     cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  auto handle = static_cast<cublasHandle_t>(handle_);
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                            static_cast<int>(cols), &alpha, w, CUDA_R_16BF, static_cast<int>(cols), x, CUDA_R_16BF,
                            static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16 linear)");
}

}  // namespace glms::ops::cuda

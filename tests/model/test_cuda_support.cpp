// Which GPUs the CUDA backend takes (model/cuda_support.h), checked without one.
#include "model/cuda_support.h"

#include <gtest/gtest.h>

namespace glms::model {

TEST(CudaSupport, HopperRunsTheKernelsOtherGpusAreToldWhy) {
  EXPECT_EQ(cuda_gpu_unsupported("NVIDIA H200", 9, 0), "");
  EXPECT_EQ(cuda_gpu_unsupported("NVIDIA H100 80GB HBM3", 9, 0), "");
  const std::string ampere = cuda_gpu_unsupported("NVIDIA A100-SXM4-80GB", 8, 0);
  EXPECT_NE(ampere.find("NVIDIA A100-SXM4-80GB has compute capability 8.0"), std::string::npos) << ampere;
  EXPECT_NE(ampere.find("Hopper"), std::string::npos) << ampere;
  EXPECT_NE(ampere.find("no earlier GPU"), std::string::npos) << ampere;
  // sm_90a code does not run forward on Blackwell either.
  const std::string blackwell = cuda_gpu_unsupported("NVIDIA B200", 10, 0);
  EXPECT_NE(blackwell.find("compute capability 10.0"), std::string::npos) << blackwell;
  EXPECT_NE(blackwell.find("no later GPU"), std::string::npos) << blackwell;
  EXPECT_NE(cuda_gpu_unsupported("NVIDIA L40S", 8, 9), "");
}

}  // namespace glms::model

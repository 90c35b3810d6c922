#include "model/cuda_support.h"

#include <fmt/format.h>

namespace glms::model {

std::string cuda_gpu_unsupported(const std::string& name, int major, int minor) {
  if (major == 9 && minor == 0) return "";
  return fmt::format(
      "{} has compute capability {}.{}, and glmserve's CUDA kernels are built for Hopper's 9.0 alone (H100, H200, "
      "GH200: its warpgroup tensor cores, TMA and clusters; that code runs on no {} GPU)",
      name, major, minor, major * 10 + minor < 90 ? "earlier" : "later");
}

}  // namespace glms::model

// Which GPUs run glmserve's CUDA backend. Its kernels are built for Hopper alone (sm_90a): they
// use its warpgroup tensor cores (wgmma), TMA and thread block clusters, and sm_90a code runs on
// no other architecture, earlier or later. A CPU-side check, so that --device auto can fall back
// to the CPU and --device cuda can say what to do before any kernel fails to load.
#pragma once

#include <string>

namespace glms::model {

// "" where a GPU of compute capability major.minor runs the kernels; else why not, naming `name`.
std::string cuda_gpu_unsupported(const std::string& name, int major, int minor);

}  // namespace glms::model

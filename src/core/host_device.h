// GLMS_HOST_DEVICE marks inline functions that host code and CUDA kernels share (one definition
// of a bit layout or a rounding, tested on the CPU and used on the GPU).
#pragma once

#if defined(__CUDACC__)
#define GLMS_HOST_DEVICE __host__ __device__
#else
#define GLMS_HOST_DEVICE
#endif

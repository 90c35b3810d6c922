// libnccl.so.2 loaded at run time. Debian packages no NCCL and CI builds without it, so glmserve
// declares the few NCCL calls it uses itself (the C ABI of nccl.h, NCCL 2.x) and resolves them
// with dlsym. GLMS_NCCL_LIBRARY names the file to load; otherwise "libnccl.so.2" is looked up
// the usual way (LD_LIBRARY_PATH, the loader's cache).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace glms::comm::nccl {

// nccl.h's types, by value as the ABI has them.
using Comm = struct NcclComm*;                     // ncclComm_t
struct UniqueId { char internal[128]; };          // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
using Result = int;                                // ncclResult_t: 0 is ncclSuccess
enum DataType : int { kInt32 = 2, kFloat32 = 7, kBfloat16 = 9 };  // ncclDataType_t
enum RedOp : int { kSum = 0 };                     // ncclRedOp_t
using Stream = void*;                              // cudaStream_t

struct Library {
  // Loads the library (GLMS_NCCL_LIBRARY, else libnccl.so.2). Throws glms::Error saying what to
  // set when it cannot be loaded or lacks a call.
  static std::shared_ptr<const Library> load();
  ~Library();

  std::string path;  // what was loaded
  int version = 0;   // ncclGetVersion: major * 10000 + minor * 100 + patch (2.18+)
  void* handle = nullptr;

  Result (*get_version)(int*) = nullptr;
  Result (*get_unique_id)(UniqueId*) = nullptr;
  Result (*comm_init_rank)(Comm*, int, UniqueId, int) = nullptr;
  Result (*comm_init_all)(Comm*, int, const int*) = nullptr;
  Result (*comm_destroy)(Comm) = nullptr;
  Result (*comm_abort)(Comm) = nullptr;
  const char* (*get_error_string)(Result) = nullptr;
  Result (*all_reduce)(const void*, void*, size_t, DataType, RedOp, Comm, Stream) = nullptr;
  Result (*all_gather)(const void*, void*, size_t, DataType, Comm, Stream) = nullptr;
  Result (*reduce_scatter)(const void*, void*, size_t, DataType, RedOp, Comm, Stream) = nullptr;
  Result (*group_start)() = nullptr;
  Result (*group_end)() = nullptr;

  // Throws glms::Error naming `call` and NCCL's message unless `result` is success.
  void check(Result result, const char* call) const;
};

// "major.minor.patch" of Library::version.
std::string version_string(int version);

}  // namespace glms::comm::nccl

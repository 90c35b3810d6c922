// Every kernel's device start and end, graph-launched ones included, written as CSV: a library
// that the CUDA driver loads into a program by CUDA_INJECTION64_PATH and that turns on CUPTI's
// kernel activity records (the GPU machine has no Nsight Systems; tools/gpu/kernel-trace builds
// and runs it). GLMS_KERNEL_TRACE names the CSV (default kernel-trace.csv).
// Columns: start_ns,end_ns,stream,graph,graph_node,grid,block,name (the demangled name, quoted).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kAlignment = 8;
std::FILE* out = nullptr;
std::mutex out_mutex;

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kernel trace: %s: %s\n", what, text ? text : "unknown CUPTI error");
  std::exit(1);
}

std::string demangled(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string text = status == 0 && plain ? plain : name;
  std::free(plain);
  for (char& c : text)
    if (c == '"') c = '\'';
  return text;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(out_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(out, "%llu,%llu,%u,%u,%llu,%d,%d,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->streamId, k->graphId,
                 static_cast<unsigned long long>(k->graphNodeId), k->gridX * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, demangled(k->name).c_str());
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(out_mutex);
  if (out) std::fclose(out);
  out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("GLMS_KERNEL_TRACE");
  out = std::fopen(path && *path ? path : "kernel-trace.csv", "w");
  if (!out) {
    std::perror("kernel trace: cannot open the CSV");
    return 0;
  }
  std::fprintf(out, "start_ns,end_ns,stream,graph,graph_node,grid,block,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  std::atexit(flush_at_exit);
  return 1;
}

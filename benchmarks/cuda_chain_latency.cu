// What one link of a decode step's kernel chain costs when the kernels do almost nothing: a CUDA
// graph of --links kernels, each reading the value the one before it wrote and writing the next,
// replayed and timed with events, as chained launches (programmatic dependent launch, the
// griddepcontrol wait and release that ops/cuda's kernels make; launch.cuh) and as plain ones.
// A rank's batch-1 step is some 20 short kernels a layer at 78 layers: the time a link takes with
// no work is the floor that fusing kernels removes and that no kernel of its own can go below.
// Grids of --blocks blocks (1: a norm or routing kernel; 132: one an SM; 528: four an SM) of 256
// threads, with --shared bytes of shared memory each. Prints one line a case and, with
// --json FILE, writes them.
// Usage: cuda_chain_latency [--links 1000] [--blocks 1,32,132,528] [--shared 0,98304] [--json FILE]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "micro_cuda.h"
#include "micro_options.h"

namespace {

using glms::benchmarks::check;

constexpr int kThreads = 256;

// Link i: waits for link i - 1 (chained), lets link i + 1 be scheduled, then block 0's first
// thread turns value[i] into value[i + 1]: a true dependency through global memory.
__global__ void __launch_bounds__(kThreads) link_kernel(int* value, int i, bool chained) {
  if (chained) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) value[i + 1] = value[i] + 1;
}

void launch_link(int* value, int i, bool chained, int blocks, int shared, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = chained ? &attribute : nullptr;
  config.numAttrs = chained ? 1 : 0;
  check(cudaLaunchKernelEx(&config, link_kernel, value, i, chained), "launch");
}

// Microseconds a link of a replayed graph of `links` kernels (the best of 10 replays after 2).
double us_per_link(int* value, int links, bool chained, int blocks, int shared, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < links; ++i) launch_link(value, i, chained, blocks, shared, stream);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  float best_ms = 1e30f;
  for (int rep = 0; rep < 12; ++rep) {
    check(cudaEventRecord(start, stream), "record");
    check(cudaGraphLaunch(exec, stream), "replay");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "link_kernel");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (rep >= 2 && ms < best_ms) best_ms = ms;
  }
  int last = 0;
  check(cudaMemcpy(&last, value + links, sizeof(int), cudaMemcpyDeviceToHost), "read back");
  if (last != links) {  // every link ran after the one before it
    std::fprintf(stderr, "the chain's last value is %d, not %d\n", last, links);
    std::exit(1);
  }
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  check(cudaGraphExecDestroy(exec), "graph");
  check(cudaGraphDestroy(graph), "graph");
  return best_ms * 1e3 / links;
}

}  // namespace

int main(int argc, char** argv) {
  int links = 1000;
  std::vector<int> block_counts = {1, 32, 132, 528}, shared_sizes = {0, 98304};
  std::string json_path;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--links", [&](const char* v) { links = std::atoi(v); }},
           {"--blocks", [&](const char* v) { block_counts = glms::benchmarks::parse_int_list(v); }},
           {"--shared", [&](const char* v) { shared_sizes = glms::benchmarks::parse_int_list(v); }},
           {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  if (!glms::benchmarks::has_cuda_device()) return 77;
  int* value = nullptr;
  check(cudaMalloc(&value, sizeof(int) * (links + 1)), "cudaMalloc");
  check(cudaMemset(value, 0, sizeof(int) * (links + 1)), "cudaMemset");
  check(cudaFuncSetAttribute(link_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024), "shared memory");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::ostringstream json;
  json << "{\"links\": " << links << ", \"points\": [";
  bool first = true;
  std::printf("%-8s %6s %7s %12s\n", "launch", "blocks", "shared", "us_per_link");
  for (const bool chained : {true, false})
    for (const int shared : shared_sizes)
      for (const int blocks : block_counts) {
        const double us = us_per_link(value, links, chained, blocks, shared, stream);
        const char* launch = chained ? "chained" : "plain";
        std::printf("%-8s %6d %7d %12.3f\n", launch, blocks, shared, us);
        json << (first ? "" : ",") << "\n  {\"launch\": \"" << launch << "\", \"blocks\": " << blocks
             << ", \"shared_bytes\": " << shared << ", \"us_per_link\": " << us << "}";
        first = false;
      }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}

// Streams, pinned host memory, copies and graphs: the CUDA runtime calls the rest of glmserve
// reaches through ops/cuda, so that no other folder includes a vendor header.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

GpuModel gpu_model(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return {prop.name, prop.major, prop.minor};
}

Stream::Stream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
void Stream::synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(cudaMallocHost(&data_, bytes), "cudaMallocHost");
}
PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFreeHost(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void copy_to_device_async(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync to device");
}
void copy_to_host_async(void* host, const void* device, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync to host");
}
void copy_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync on device");
}
void memset_async(void* device, int value, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) check(cudaMemsetAsync(device, value, bytes, stream), "cudaMemsetAsync");
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}
void Graph::begin_capture(cudaStream_t stream) {
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}
void Graph::end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  exec_ = exec;
}
void Graph::launch(cudaStream_t stream) const {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream), "cudaGraphLaunch");
}

Event::Event() {
  cudaEvent_t event = nullptr;
  check(cudaEventCreate(&event), "cudaEventCreate");
  event_ = event;
}
Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void Event::record(cudaStream_t stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event_), stream), "cudaEventRecord");
}
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_), static_cast<cudaEvent_t>(event_)),
        "cudaEventElapsedTime");
  return ms;
}

void Event::make_wait(cudaStream_t stream) const {
  check(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event_), 0), "cudaStreamWaitEvent");
}

void synchronize_device() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

std::pair<size_t, size_t> memory_info() {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return {free_bytes, total_bytes};
}

void profiler_range(bool start) {
  check(start ? cudaProfilerStart() : cudaProfilerStop(), start ? "cudaProfilerStart" : "cudaProfilerStop");
}

}  // namespace glms::ops::cuda

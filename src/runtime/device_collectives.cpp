#include "runtime/device_collectives.h"

#include <vector>

#include "comm/rank_barrier.h"
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::runtime {

namespace {

namespace cuda = ops::cuda;

cudaStream_t as_stream(comm::Stream stream) { return static_cast<cudaStream_t>(stream); }

// One rank of a device-copy group: a rank's buffers are read by its peers between barriers.
class DeviceCopyRank : public comm::Communicator {
 public:
  DeviceCopyRank(std::shared_ptr<comm::RankBarrier> barrier, int rank) : barrier_(std::move(barrier)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return barrier_->size(); }
  std::string backend() const override { return "device-copies"; }

  void all_reduce_sum(void* data, size_t count, comm::Element type, comm::Stream stream) override {
    GLMS_CHECK(type == comm::Element::F32, "device-copy all-reduce sums fp32");
    sum_slices(data, 0, count, type, stream);
    barrier_->arrive_and_wait();  // every peer has read our buffer
    cuda::copy_device_async(data, sum_.data(), count * sizeof(float), as_stream(stream));
    cuda::synchronize_stream(as_stream(stream));
  }
  void all_gather(const void* send, void* recv, size_t count, comm::Element type, comm::Stream stream) override {
    const size_t bytes = count * comm::element_size(type);
    cuda::synchronize_stream(as_stream(stream));
    barrier_->publish(rank_, send);
    for (int r = 0; r < size(); ++r)
      cuda::copy_device_async(static_cast<char*>(recv) + r * bytes, barrier_->published(r), bytes, as_stream(stream));
    cuda::synchronize_stream(as_stream(stream));
    barrier_->arrive_and_wait();
  }
  // fp32, or bf16 summed in fp32 and rounded once (NCCL rounds after each of its additions).
  void reduce_scatter_sum(const void* send, void* recv, size_t count, comm::Element type,
                          comm::Stream stream) override {
    GLMS_CHECK(type == comm::Element::F32 || type == comm::Element::BF16,
               "device-copy reduce-scatter sums fp32 or bf16");
    sum_slices(send, static_cast<size_t>(rank_) * count, count, type, stream);
    if (type == comm::Element::BF16)
      cuda::round_to_bf16(sum_.as<float>(), static_cast<int64_t>(count), static_cast<uint16_t*>(recv),
                          as_stream(stream));
    else
      cuda::copy_device_async(recv, sum_.data(), count * sizeof(float), as_stream(stream));
    cuda::synchronize_stream(as_stream(stream));
    barrier_->arrive_and_wait();
  }

 private:
  // sum_ = the ranks' published buffers (of `type`, F32 or BF16) at [offset, offset + count),
  // added in rank order in fp32.
  void sum_slices(const void* mine, size_t offset, size_t count, comm::Element type, comm::Stream stream) {
    const size_t bytes = count * sizeof(float);
    if (sum_.bytes() < bytes) {
      sum_ = cuda::DeviceBuffer(bytes);
      peer_ = cuda::DeviceBuffer(bytes);
    }
    cuda::synchronize_stream(as_stream(stream));
    barrier_->publish(rank_, mine);
    for (int r = 0; r < size(); ++r) {
      float* const into = r == 0 ? sum_.as<float>() : peer_.as<float>();
      if (type == comm::Element::BF16) {
        cuda::widen_bf16(static_cast<const uint16_t*>(barrier_->published(r)) + offset, static_cast<int64_t>(count),
                         into, as_stream(stream));
      } else {
        cuda::copy_device_async(into, static_cast<const float*>(barrier_->published(r)) + offset, bytes,
                                as_stream(stream));
      }
      if (r > 0)
        cuda::add_f32(sum_.as<float>(), peer_.as<float>(), sum_.as<float>(), static_cast<int64_t>(count),
                      as_stream(stream));
    }
    cuda::synchronize_stream(as_stream(stream));
  }

  std::shared_ptr<comm::RankBarrier> barrier_;
  int rank_;
  cuda::DeviceBuffer sum_, peer_;
};

class DeviceCopyGroups : public RankGroups {
 public:
  explicit DeviceCopyGroups(const ParallelLayout& layout) : layout_(layout) {
    if (layout.tensor_parallel > 1) tp_ = make_groups(tensor_parallel_groups(layout), tp_barriers_);
    if (layout.data_parallel > 1) dp_ = make_groups(data_parallel_groups(layout), dp_barriers_);
  }
  model::Peers peers(int world_rank) const override {
    model::Peers p;
    if (!tp_.empty()) p.tp = tp_[world_rank].get();
    if (!dp_.empty()) p.dp = dp_[world_rank].get();
    return p;
  }
  std::string backend() const override { return "device-copies"; }
  void abort(const std::string& reason) override {
    for (auto& b : tp_barriers_) b->abort(reason);
    for (auto& b : dp_barriers_) b->abort(reason);
  }
  bool reset() override {
    for (auto& b : tp_barriers_) b->reset();
    for (auto& b : dp_barriers_) b->reset();
    return true;
  }

 private:
  // One communicator per world rank, indexed by world rank.
  std::vector<std::unique_ptr<comm::Communicator>> make_groups(const std::vector<std::vector<int>>& groups,
                                                               std::vector<std::shared_ptr<comm::RankBarrier>>& barriers) {
    std::vector<std::unique_ptr<comm::Communicator>> by_rank(layout_.world_size());
    for (const std::vector<int>& group : groups) {
      auto barrier = std::make_shared<comm::RankBarrier>(static_cast<int>(group.size()));
      barriers.push_back(barrier);
      for (size_t i = 0; i < group.size(); ++i)
        by_rank[group[i]] = std::make_unique<DeviceCopyRank>(barrier, static_cast<int>(i));
    }
    return by_rank;
  }
  ParallelLayout layout_;
  std::vector<std::shared_ptr<comm::RankBarrier>> tp_barriers_, dp_barriers_;
  std::vector<std::unique_ptr<comm::Communicator>> tp_, dp_;
};

class SimulatedPeer : public comm::Communicator {
 public:
  SimulatedPeer(int rank, int size, int num_experts, size_t max_all_reduce_bytes)
      : rank_(rank), size_(size), num_experts_(num_experts), scratch_(max_all_reduce_bytes) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "simulated"; }
  bool graph_capturable() const override { return true; }

  // The collectives' copies are chained kernels (copy_chained), as a real collective is a kernel
  // in the stream: a copy-engine node of a captured step broke the chain of programmatic
  // launches and left the GPU idle about 2 us before the next kernel (a batch-1 step of the EP8
  // rank, once a MoE layer), a wait the plan's per-collective latency already counts.
  void all_reduce_sum(void* data, size_t count, comm::Element type, comm::Stream stream) override {
    const size_t bytes = count * comm::element_size(type);
    GLMS_CHECK(bytes <= scratch_.bytes(), "simulated all-reduce beyond its scratch");
    copy_chained(scratch_.data(), data, bytes, as_stream(stream));  // what arrives, in place
    copy_chained(data, scratch_.data(), bytes, as_stream(stream));
  }
  // A group's all-gathers go out as one launch at end_group, as NCCL's group call is one.
  void begin_group() override { grouped_ = true; }
  void end_group() override {
    grouped_ = false;
    flush();
  }
  void all_gather(const void* send, void* recv, size_t count, comm::Element type, comm::Stream stream) override {
    if (pending_.size() == static_cast<size_t>(cuda::kMaxSimulatedGatherParts)) flush();
    cuda::SimulatedGatherPart part;
    part.send = send;
    part.recv = recv;
    part.bytes = static_cast<int64_t>(count * comm::element_size(type));
    part.shift_experts = type == comm::Element::I32 && num_experts_ > 0;
    pending_.push_back(part);
    pending_stream_ = as_stream(stream);
    if (!grouped_) flush();
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, comm::Element type,
                          comm::Stream stream) override {
    const size_t bytes = count * comm::element_size(type);
    copy_chained(recv, static_cast<const char*>(send) + rank_ * bytes, bytes, as_stream(stream));
  }

 private:
  // `bytes` (whole 4-byte words: fp32 or bf16 rows of even width) from src to dst as one chained
  // launch: simulated_all_gather's copy into a single slot.
  static void copy_chained(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    GLMS_CHECK(bytes % 4 == 0, "simulated collectives copy whole 4-byte words");
    cuda::SimulatedGatherPart part;
    part.send = src;
    part.recv = dst;
    part.bytes = static_cast<int64_t>(bytes);
    cuda::simulated_all_gather(&part, 1, 1, 0, 0, stream);
  }

  void flush() {
    cuda::simulated_all_gather(pending_.data(), static_cast<int>(pending_.size()), size_, rank_, num_experts_,
                               pending_stream_);
    pending_.clear();
  }

  int rank_, size_, num_experts_;
  cuda::DeviceBuffer scratch_;
  bool grouped_ = false;
  std::vector<cuda::SimulatedGatherPart> pending_;
  cudaStream_t pending_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<RankGroups> make_device_copy_groups(const ParallelLayout& layout) {
  return std::make_unique<DeviceCopyGroups>(layout);
}

std::unique_ptr<comm::Communicator> make_simulated_peer(int rank, int size, int num_experts,
                                                        size_t max_all_reduce_bytes) {
  return std::make_unique<SimulatedPeer>(rank, size, num_experts, max_all_reduce_bytes);
}

}  // namespace glms::runtime

#include "comm/cpu_group.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace glms::comm {

size_t element_size(Element type) {
  switch (type) {
    case Element::F32: return 4;
    case Element::BF16: return 2;
    case Element::I32: return 4;
  }
  return 0;
}

namespace {

// out[i] = sum over ranks r (in rank order) of in[r][offset + i], in fp32 (int32 for I32).
void sum_ranks(const std::vector<const void*>& in, size_t offset, size_t count, Element type, void* out) {
  switch (type) {
    case Element::F32: {
      auto* y = static_cast<float*>(out);
      for (size_t i = 0; i < count; ++i) {
        float sum = 0.0f;
        for (const void* rank : in) sum += static_cast<const float*>(rank)[offset + i];
        y[i] = sum;
      }
      return;
    }
    case Element::BF16: {
      auto* y = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < count; ++i) {
        float sum = 0.0f;
        for (const void* rank : in) sum += bf16_to_f32(static_cast<const uint16_t*>(rank)[offset + i]);
        y[i] = f32_to_bf16(sum);
      }
      return;
    }
    case Element::I32: {
      auto* y = static_cast<int32_t*>(out);
      for (size_t i = 0; i < count; ++i) {
        int64_t sum = 0;
        for (const void* rank : in) sum += static_cast<const int32_t*>(rank)[offset + i];
        y[i] = static_cast<int32_t>(sum);
      }
      return;
    }
  }
}

}  // namespace

class CpuGroup::Rank : public Communicator {
 public:
  Rank(std::shared_ptr<RankBarrier> barrier, int rank) : barrier_(std::move(barrier)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return barrier_->size(); }
  std::string backend() const override { return "cpu"; }

  // Publish, wait for every rank, combine from the published buffers, wait again so that no
  // buffer is reused while a peer still reads it.
  void all_reduce_sum(void* data, size_t count, Element type, Stream) override {
    std::vector<std::byte> sum(count * element_size(type));
    barrier_->publish(rank_, data);
    sum_ranks(barrier_->all_published(), 0, count, type, sum.data());
    barrier_->arrive_and_wait();
    std::memcpy(data, sum.data(), sum.size());
  }
  void all_gather(const void* send, void* recv, size_t count, Element type, Stream) override {
    const size_t bytes = count * element_size(type);
    barrier_->publish(rank_, send);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes, barrier_->published(r), bytes);
    barrier_->arrive_and_wait();
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, Element type, Stream) override {
    barrier_->publish(rank_, send);
    sum_ranks(barrier_->all_published(), static_cast<size_t>(rank_) * count, count, type, recv);
    barrier_->arrive_and_wait();
  }

 private:
  std::shared_ptr<RankBarrier> barrier_;
  int rank_;
};

CpuGroup::CpuGroup(int size) {
  if (size < 1) fail("a parallel group needs at least one rank");
  barrier_ = std::make_shared<RankBarrier>(size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(barrier_, r));
}

CpuGroup::~CpuGroup() = default;

int CpuGroup::size() const { return barrier_->size(); }

Communicator& CpuGroup::rank(int rank) {
  GLMS_CHECK(rank >= 0 && rank < size(), "CpuGroup::rank out of range");
  return *ranks_[rank];
}

void CpuGroup::abort(const std::string& reason) { barrier_->abort(reason); }

void CpuGroup::reset() { barrier_->reset(); }

}  // namespace glms::comm

#include "comm/cpu_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

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

// The group's shared state: one published pointer per rank and a reusable barrier.
struct CpuGroup::State {
  explicit State(int n) : size(n), published(static_cast<size_t>(n), nullptr) {}

  // Blocks until all `size` ranks have arrived (or the group is aborted: then throws).
  void barrier() {
    std::unique_lock lock(mutex);
    if (!abort_reason.empty()) fail("collective aborted: " + abort_reason);
    const uint64_t generation = barrier_generation;
    if (++arrived == size) {
      arrived = 0;
      ++barrier_generation;
      wake.notify_all();
      return;
    }
    wake.wait(lock, [&] { return barrier_generation != generation || !abort_reason.empty(); });
    if (barrier_generation == generation) fail("collective aborted: " + abort_reason);
  }

  int size;
  std::vector<const void*> published;  // [size] each rank's buffer in the collective under way
  std::mutex mutex;
  std::condition_variable wake;
  int arrived = 0;
  uint64_t barrier_generation = 0;
  std::string abort_reason;
};

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
  Rank(std::shared_ptr<State> state, int rank) : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string backend() const override { return "cpu"; }

  // Publish, wait for every rank, combine from the published buffers, wait again so that no
  // buffer is reused while a peer still reads it.
  void all_reduce_sum(void* data, size_t count, Element type, Stream) override {
    std::vector<std::byte> sum(count * element_size(type));
    publish(data);
    sum_ranks(state_->published, 0, count, type, sum.data());
    state_->barrier();
    std::memcpy(data, sum.data(), sum.size());
  }
  void all_gather(const void* send, void* recv, size_t count, Element type, Stream) override {
    const size_t bytes = count * element_size(type);
    publish(send);
    for (int r = 0; r < state_->size; ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes, state_->published[r], bytes);
    state_->barrier();
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, Element type, Stream) override {
    publish(send);
    sum_ranks(state_->published, static_cast<size_t>(rank_) * count, count, type, recv);
    state_->barrier();
  }

 private:
  void publish(const void* buffer) {
    state_->published[rank_] = buffer;  // read by peers only after the barrier below
    state_->barrier();
  }
  std::shared_ptr<State> state_;
  int rank_;
};

CpuGroup::CpuGroup(int size) : state_(std::make_shared<State>(size)) {
  if (size < 1) fail("a parallel group needs at least one rank");
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(state_, r));
}

CpuGroup::~CpuGroup() = default;

int CpuGroup::size() const { return state_->size; }

Communicator& CpuGroup::rank(int rank) {
  GLMS_CHECK(rank >= 0 && rank < state_->size, "CpuGroup::rank out of range");
  return *ranks_[rank];
}

void CpuGroup::abort(const std::string& reason) {
  std::lock_guard lock(state_->mutex);
  if (state_->abort_reason.empty()) state_->abort_reason = reason.empty() ? "a peer rank failed" : reason;
  state_->wake.notify_all();
}

void CpuGroup::reset() {
  std::lock_guard lock(state_->mutex);
  state_->abort_reason.clear();
  state_->arrived = 0;
  ++state_->barrier_generation;
}

}  // namespace glms::comm

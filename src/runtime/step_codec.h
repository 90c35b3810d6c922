// Steps and their results as bytes, for the control messages between the processes of a
// multi-node run (runtime/distributed_executor.h): what process 0 sends every other process before
// a step, and what comes back from the processes that host a data-parallel rank's first peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "model/step_runner.h"
#include "runtime/executor.h"

namespace glms::runtime {

enum class Command : uint8_t { kAllocate, kForward, kMtpForward, kStop };

// Appends values to a byte buffer and reads them back in the same order.
class ByteWriter {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "put() copies bytes: write such a type field by field");
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_vector(const std::vector<T>& values) {
    static_assert(std::is_trivially_copyable_v<T>, "put_vector() copies bytes: write such a type field by field");
    put<uint64_t>(values.size());
    const auto* p = reinterpret_cast<const std::byte*>(values.data());
    bytes.insert(bytes.end(), p, p + sizeof(T) * values.size());
  }
  std::vector<std::byte> bytes;
};

class ByteReader {
 public:
  explicit ByteReader(const std::vector<std::byte>& bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>, "get() copies bytes: read such a type field by field");
    T value;
    take(&value, sizeof(T));
    return value;
  }
  template <typename T>
  std::vector<T> get_vector() {
    static_assert(std::is_trivially_copyable_v<T>, "get_vector() copies bytes: read such a type field by field");
    std::vector<T> values(get<uint64_t>());
    take(values.data(), sizeof(T) * values.size());
    return values;
  }

 private:
  void take(void* out, size_t size);
  const std::vector<std::byte>& bytes_;
  size_t at_ = 0;
};

// One step's batches (h_prev rows included for MTP steps: `hidden` floats a token).
void write_steps(ByteWriter& out, const std::vector<RankStep>& steps, int64_t hidden);
// The steps, pointing into `h_prev_rows` for their MTP inputs.
std::vector<RankStep> read_steps(ByteReader& in, int64_t hidden, std::vector<std::vector<float>>& h_prev_rows);

void write_result(ByteWriter& out, const RankResult& result);
RankResult read_result(ByteReader& in);

void write_cache_shape(ByteWriter& out, const model::CacheShape& shape);
model::CacheShape read_cache_shape(ByteReader& in);

}  // namespace glms::runtime

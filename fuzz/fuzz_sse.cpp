// libFuzzer target: the bench's SSE parser. The first byte sets a chunk size; feeding the rest in
// those chunks gives the same events as feeding it whole, and every event's data is interpreted
// without a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/sse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 13;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  glms::bench::SseParser whole, split;
  std::vector<std::string> a, b;
  whole.feed(stream, a);
  a.push_back(whole.finish());
  for (size_t at = 0; at < stream.size(); at += chunk) split.feed(stream.substr(at, chunk), b);
  b.push_back(split.finish());
  if (a != b) std::abort();
  for (const std::string& event : a) (void)glms::bench::interpret_event(event);
  return 0;
}

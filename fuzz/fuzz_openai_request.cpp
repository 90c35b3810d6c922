// libFuzzer target: request body bytes -> chat and completion request parsing. Any input must
// either parse or throw ApiException with a 4xx status; anything else (a crash, another
// exception, a sanitizer report) is a bug. Run:
//   build-fuzz/fuzz/fuzz_openai_request -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (int endpoint = 0; endpoint < 2; ++endpoint) {
    try {
      if (endpoint == 0) {
        const glms::server::ChatRequest r = glms::server::parse_chat_request(body);
        if (!r.messages || r.messages->empty() || r.sampling.n < 1) std::abort();
      } else {
        const glms::server::CompletionRequest r = glms::server::parse_completion_request(body);
        if (r.prompts.empty()) std::abort();
      }
    } catch (const glms::server::ApiException& e) {
      if (e.error.status < 400 || e.error.status >= 500 || e.error.message.empty()) std::abort();
    }
  }
  return 0;
}

// libFuzzer target: request body bytes -> Anthropic Messages request -> the chat completion
// request it becomes -> chat request parsing. Any input must either convert and parse, or throw
// ApiException with a 4xx status and a message; anything else (a crash, another exception, a
// sanitizer report, a converted body that is not JSON) is a bug. Run:
//   build-fuzz/fuzz/fuzz_anthropic_messages -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const bool count_only : {false, true}) {
    try {
      const std::string chat = glms::server::chat_request_of_message(body, count_only);
      if (!nlohmann::json::accept(chat)) std::abort();
      const glms::server::ChatRequest r = glms::server::parse_chat_request(chat);
      if (!r.messages || r.messages->empty()) std::abort();
    } catch (const glms::server::ApiException& e) {
      if (e.error.status < 400 || e.error.status >= 500 || e.error.message.empty()) std::abort();
    }
  }
  return 0;
}

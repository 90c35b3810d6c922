// libFuzzer target: request body bytes -> OpenAI Responses request -> the chat completion request
// it becomes -> chat request parsing, and its echo -> a Response object. Any input must either
// convert and parse, or throw ApiException with a 4xx status and a message; anything else (a
// crash, another exception, a sanitizer report, a converted body or echo that is not JSON) is a
// bug. Run:
//   build-fuzz/fuzz/fuzz_responses_request -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const glms::server::ResponsesRequest translated = glms::server::chat_request_of_response_request(body);
    if (!nlohmann::json::accept(translated.chat_request) || !nlohmann::json::accept(translated.echo)) std::abort();
    const glms::server::ChatRequest r = glms::server::parse_chat_request(translated.chat_request);
    if (!r.messages || r.messages->empty()) std::abort();
    // The echo makes a Response around any answer.
    const std::string answer =
        R"({"id":"chatcmpl-f","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant",)"
        R"("content":"x","reasoning_content":"y"},"finish_reason":"length"}],"usage":{"prompt_tokens":1}})";
    if (!nlohmann::json::accept(glms::server::response_of_chat_completion(answer, translated.echo))) std::abort();
  } catch (const glms::server::ApiException& e) {
    if (e.error.status < 400 || e.error.status >= 500 || e.error.message.empty()) std::abort();
  }
  return 0;
}

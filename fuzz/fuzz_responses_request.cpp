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
#include "server/responses_store.h"

// A store holding one answer (resp_f), so that previous_response_id reaches a stored conversation.
const glms::server::ResponsesStore& store_with_one_answer() {
  static glms::server::ResponsesStore* store = [] {
    auto* s = new glms::server::ResponsesStore(4);
    s->put("resp_f", {R"({"id":"resp_f"})", R"([{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}])"});
    return s;
  }();
  return *store;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const bool stored = size > 0 && data[0] % 2 == 0;  // half the inputs with a store
    const glms::server::ResponsesRequest translated =
        glms::server::chat_request_of_response_request(body, stored ? &store_with_one_answer() : nullptr);
    if (!nlohmann::json::accept(translated.chat_request) || !nlohmann::json::accept(translated.echo) ||
        !nlohmann::json::accept(translated.conversation))
      std::abort();
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

// OpenAI's Responses API (POST /v1/responses) over the chat completion pipeline, as vLLM serves it
// for clients such as the Codex CLI and the Agents SDK: a Responses request becomes a chat
// completion request (instructions, message, function_call, function_call_output and reasoning
// items, function tools, tool_choice, text.format, reasoning.effort), and the chat completion, or
// its stream, becomes a Response object, or the Responses stream events (response.created, output
// items for reasoning, the message and each function call with their deltas, response.completed
// or response.incomplete). With a ResponsesStore, answers are kept for previous_response_id;
// without one, previous_response_id is refused. See docs/api.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "server/http_types.h"

namespace glms::server {

class ResponsesStore;

struct ResponsesRequest {
  std::string chat_request;  // the chat completion request body (OpenAI's JSON) that answers it
  std::string echo;          // JSON object: the request's fields every Response of it repeats
                             // (instructions, tools, tool_choice, text, reasoning, ...)
  std::string conversation;  // JSON array: the chat messages before the answer, the previous
                             // response's included and the instructions left out
  bool store = false;        // keep the answer in the store (a store was given and `store` is not false)
};

// Throws ApiException 400 naming the field that is missing, of the wrong type or not supported
// (built-in tools, previous_response_id without a store, background, ...), 404 for a
// previous_response_id the store does not hold.
ResponsesRequest chat_request_of_response_request(std::string_view body, const ResponsesStore* store = nullptr);

// The Response object of a chat completion body (its first choice) and the request's echo.
std::string response_of_chat_completion(const std::string& chat_completion, const std::string& echo);

// A Responder that takes the chat pipeline's answers (a chat completion, an OpenAI error, which
// the Responses API shares, or a chat completion stream) and writes the Responses API's to `inner`;
// where `request.store`, the finished Response goes into `store` with its conversation.
std::shared_ptr<Responder> responses_responder(std::shared_ptr<Responder> inner, ResponsesRequest request,
                                               ResponsesStore* store = nullptr);

}  // namespace glms::server

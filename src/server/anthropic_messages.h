// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens) over the chat
// completion pipeline, as vLLM serves it for Claude Code (ANTHROPIC_BASE_URL=http://HOST:PORT):
// a Messages request becomes a chat completion request (system, text, tool_use, tool_result and
// thinking blocks, tools, tool_choice, thinking, stop_sequences), and the chat completion, or its
// stream, becomes a message, or Anthropic's events (message_start, content_block_start/delta/stop
// for thinking, text and tool_use blocks, message_delta, message_stop, error). See docs/api.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "server/http_types.h"

namespace glms::server {

// The chat completion request body (OpenAI's JSON) that answers an Anthropic Messages request
// body; `count_only` (count_tokens) needs no max_tokens. Throws ApiException 400 naming the field
// that is missing, of the wrong type or not supported (images, documents, server tools).
std::string chat_request_of_message(std::string_view body, bool count_only = false);

// The Anthropic message of a chat completion body (its first choice).
std::string message_of_chat_completion(const std::string& chat_completion);

// Anthropic's error body for an HTTP status and message.
std::string anthropic_error_body(int status, const std::string& message);

// A Responder that takes the chat pipeline's answers (a chat completion, an OpenAI error, or a
// chat completion stream) and writes Anthropic's to `inner`.
std::shared_ptr<Responder> anthropic_responder(std::shared_ptr<Responder> inner);

}  // namespace glms::server

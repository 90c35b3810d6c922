// OpenAI request JSON -> validated request structs (the vLLM dialect of the API).
//
// Contract: parse_chat_request / parse_completion_request either return a fully validated
// request or throw ApiException with status 400 (bad JSON, wrong field type or value, named in
// `param`), 400 for invalid UTF-8 or JSON nested deeper than Limits::max_json_depth, and never
// anything else. Unknown fields are ignored (as vLLM does by default); known fields with the
// wrong type are rejected. `null` means "not given" for every optional field.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace glms::server {

struct ParseLimits {
  int max_json_depth = 64;
  int max_n = 16;              // choices per request
  int max_stop_strings = 16;
  int max_top_logprobs = 20;
  int max_bad_words = 256;     // vLLM's bad_words, per request
};

// Fields shared by both endpoints.
struct SamplingFields {
  std::string model;                // empty when omitted
  std::optional<int> max_tokens;    // max_tokens or max_completion_tokens
  bool max_tokens_to_context = false;  // a max_tokens past the context is cut to it (not parsed: Anthropic's path)
  std::optional<float> temperature; // unset: the server's default (generation_config.json)
  std::optional<float> top_p;
  std::optional<int> top_k;         // -1 or 0 = off
  std::optional<float> min_p;
  std::optional<uint64_t> seed;
  std::string cache_salt;           // vLLM's: the prefix-cache part this request shares (empty: none)
  std::string request_id;           // vLLM's: the answer's id is chatcmpl-/cmpl- and this (empty: a random one)
  // vLLM's add_special_tokens: the tokenizer's post-processor tokens around a text prompt
  // (default: true for completions, false for chat, whose template writes its own)
  bool add_special_tokens = false;
  // Top-level fields of the body that glmserve neither reads nor accepts by name: ignored, and
  // logged as vLLM logs them
  std::vector<std::string> ignored_fields;
  std::vector<std::string> stop;    // stop strings (matched on the output text)
  std::vector<int32_t> stop_token_ids;
  int n = 1;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  bool continuous_usage_stats = false;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  int logprobs = -1;                // -1 none; else number of top alternatives (0 = chosen only)
  int prompt_logprobs = -1;         // -1 none; else each prompt token's logprob plus this many top ones (vLLM's)
  // logprobs name tokens "token_id:N" (vLLM's return_tokens_as_token_ids; unset: the server's default)
  std::optional<bool> tokens_as_ids;
  bool return_token_ids = false;    // the answer carries prompt_token_ids and each choice's token_ids (vLLM's)
  bool include_reasoning = true;    // chat: false drops the reasoning from the answer (vLLM's)
  int truncate_prompt_tokens = 0;   // vLLM's: keep the prompt's last k tokens; -1: max_model_len of them; 0: all
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the token's logit before sampling
  // vLLM's allowed_token_ids: only these may be drawn (nullopt: any; never an empty list)
  std::optional<std::vector<int32_t>> allowed_token_ids;
  std::vector<std::string> bad_words;  // vLLM's: words the output never contains (tokenised by the service)
  int min_tokens = 0;               // EOS, stop_token_ids and stop strings are held back until this many tokens
  std::vector<std::string> choice;  // structured output: exactly one of these (structured_outputs.choice, guided_choice)
  std::string regex;                // structured output: the whole output matches it (structured_outputs.regex, guided_regex)
  bool json_object = false;         // structured output: one JSON object (response_format json_object, structured_outputs.json_object)
  // structured output: JSON valid against this schema, its keys in the request's order
  // (response_format json_schema, structured_outputs.json, guided_json)
  std::shared_ptr<const nlohmann::ordered_json> json_schema;
  std::string json_schema_param;  // the field it came in, for errors about it
  std::string grammar;              // structured output: GBNF text (structured_outputs.grammar, guided_grammar)
  // structured output: vLLM's structural tag, {structures, triggers} in the request's key order
  // (response_format type structural_tag, structured_outputs.structural_tag)
  std::shared_ptr<const nlohmann::ordered_json> structural_tag;
  std::string structural_tag_param;  // the field it came in, for errors about it
  int structured_forms() const {
    return !choice.empty() + !regex.empty() + json_object + (json_schema != nullptr) + !grammar.empty() +
           (structural_tag != nullptr);
  }
};

// A request id given in a body's request_id or an X-Request-Id header (`param`): 1 to 256 bytes
// and no control characters, as it goes into response ids and the access log's line; a 400
// naming `param` else.
std::string checked_request_id(const std::string& id, const std::string& param);

struct ChatRequest {
  SamplingFields sampling;
  std::shared_ptr<const nlohmann::json> messages;   // validated array, content normalised
  std::shared_ptr<const nlohmann::json> tools;      // array of {type:function, function:{...}} or null
  std::string tool_choice = "auto";                 // "auto", "none", "required" or "function" (tool_function)
  std::string tool_function;                        // the function a named tool_choice forces
  bool parallel_tool_calls = true;                  // a forced tool_choice may make several calls
  std::shared_ptr<const nlohmann::ordered_json> tools_in_order;  // the tools in key order, when a call is forced
  std::shared_ptr<const nlohmann::json> template_kwargs;  // object (chat_template_kwargs)
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  // vLLM's echo for chat: the final message's text when it is the assistant's, which each
  // choice's content then starts with (empty: no echo).
  std::string echo_text;
  std::string chat_template;        // a request's own Jinja template (vLLM's field), empty: the model's
};

using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  SamplingFields sampling;
  std::vector<Prompt> prompts;  // one choice group per prompt
  bool echo = false;
};

ChatRequest parse_chat_request(std::string_view body, const ParseLimits& limits = {});
CompletionRequest parse_completion_request(std::string_view body, const ParseLimits& limits = {});

// Throws ApiException (400) unless `body` is valid UTF-8 with JSON nesting <= max_depth.
// Exposed for the tests and the fuzzer.
void check_body_text(std::string_view body, int max_depth);

bool is_valid_utf8(std::string_view text);

}  // namespace glms::server

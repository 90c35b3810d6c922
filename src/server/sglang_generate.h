// SGLang's native API, POST /generate, over the completions pipeline: a body of `text` (or
// `input_ids`), one or a batch, with `sampling_params` (max_new_tokens, temperature, stop,
// json_schema, regex, ebnf, ...), `stream`, `return_logprob` and `rid` becomes a completions
// request; its answer becomes SGLang's {"text", "output_ids", "meta_info": {"id", "finish_reason",
// "prompt_tokens", "completion_tokens", "cached_tokens"}} (a list of them for a batch or n > 1),
// and a stream SGLang's events, each holding the whole text so far. See docs/api.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "server/http_types.h"

namespace glms::server {

struct GenerateRequest {
  std::string completion_request;  // the completions body (OpenAI's JSON); the responder needs none of it
  bool batch = false;              // text or input_ids was a list of prompts: the answer is a list
  int n = 1;                       // choices a prompt (a list too when above 1)
  bool logprobs = false;           // return_logprob
};

// Throws ApiException 400 naming the field that is missing, of the wrong type or not supported.
GenerateRequest completion_request_of_generate(std::string_view body);

// A Responder that takes the completions pipeline's answers (a completion, an error, or a
// completion stream) and writes SGLang's to `inner`.
std::shared_ptr<Responder> sglang_generate_responder(std::shared_ptr<Responder> inner, GenerateRequest request);

}  // namespace glms::server

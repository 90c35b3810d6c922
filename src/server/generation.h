// One OpenAI request in flight: its engine requests (n choices per prompt), the text pipeline
// of every choice (incremental detokenizer -> stop strings -> reasoning/tool parser), and the
// response it produces (one JSON body, or SSE chunks as outputs arrive).
//
// Threading: outputs arrive on the engine thread, abort() on a transport thread; one mutex
// guards the state. Backend::cancel is never called with that mutex held.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/backend.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/text_stream.h"
#include "text/tokenizer.h"

namespace glms::server {

struct GenerationSpec {
  bool chat = true;
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  std::string model;    // served model name
  int64_t created = 0;  // Unix seconds
  SamplingFields sampling;  // validated fields (stop, logprobs, n, stream, ...)
  bool echo = false;    // completions: prepend the prompt text
  std::string chat_echo;  // chat: what each choice's content starts with (ChatRequest::echo_text)
  struct PromptInput {
    std::vector<int32_t> ids;
    std::string text;   // for echo
  };
  std::vector<PromptInput> prompts;
  // Per choice (prompt-major: choice index = prompt * n + i), ready for the engine.
  std::vector<engine::RequestParams> params;
  // Chat: the parser for each choice and the special tokens that reach it as text (the GLM
  // markup: <think>, <tool_call>, ...). Other special tokens are dropped from chat text.
  ParserFactory parser_factory;
  ParserOptions parser_options;
  std::vector<int32_t> chat_text_special_ids;
  // The access line written when the request ends ("CLIENT METHOD PATH"), empty: none.
  std::string access_log;
};

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(GenerationSpec spec, text::Tokenizer tokenizer, Backend& backend, ServerMetrics& metrics,
             std::shared_ptr<Responder> responder);
  ~Generation();

  // Submits every choice and, for streams, sends the response head (and the role chunks).
  // Throws ApiException: 429 when the engine queue is full, 400 when the engine rejects the
  // request; nothing was sent then and no engine request is left running.
  void start();

  // The client went away: cancel every engine request still running.
  void abort();

 private:
  struct Choice;
  void on_output(size_t choice, const engine::RequestOutput& out);
  void finish_choice(Choice& c, const std::string& reason);
  void take_prompt_logprobs(Choice& c, const engine::RequestOutput& out);
  void record_logprobs(Choice& c, const engine::GeneratedToken& g, size_t text_offset);
  std::string token_name(int32_t id) const;
  void route_released(Choice& c, const std::string& released, std::string& final_reason);
  void respond_locked(size_t choice_index, bool choice_done, std::vector<std::string>& writes,
                      std::optional<HttpResponse>& reply, bool& end);
  void emit_locked(std::vector<std::string>& writes, size_t choice_index, bool final);
  std::string final_body_locked() const;
  std::string usage_json_locked() const;
  // "CLIENT METHOD PATH STATUS 1.234 s prompt P cached C completion N finish R" for the log.
  std::string access_line_locked(int status) const;

  GenerationSpec spec_;
  text::Tokenizer tokenizer_;
  Backend& backend_;
  ServerMetrics& metrics_;
  std::shared_ptr<Responder> responder_;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace glms::server

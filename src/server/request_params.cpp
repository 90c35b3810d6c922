// How a parsed request becomes what the engine runs (api_service.h): the sampling defaults and
// the context's limits, the bad words as token sequences, the structured output's matcher, the
// request id an X-Request-Id names, and the log line of the fields it held that are not read.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "log/log.h"
#include "server/api_error.h"
#include "server/api_service.h"
#include "structured/choice.h"
#include "structured/json_schema.h"
#include "structured/recognizer.h"
#include "structured/regex.h"
#include "structured/structural_tag.h"
#include "structured/tool_calls.h"
#include "text/utf8.h"

namespace glms::server {

using nlohmann::json;

namespace {

// Python's str.lstrip(), as vLLM strips a bad word. `s` is valid UTF-8 (the body was).
std::string_view without_leading_space(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!text::utf8::is_python_space(text::utf8::decode_at(s, next))) break;
    pos = next;
  }
  return s.substr(pos);
}

}  // namespace

// vLLM's reading of bad_words: each word without its leading whitespace as the text's first word,
// and, where a space before it gives another first token but as many tokens, as a later word.
std::vector<std::vector<int32_t>> ApiService::bad_word_sequences(const std::vector<std::string>& words) const {
  std::vector<std::vector<int32_t>> sequences;
  for (const std::string& word : words) {
    const std::string stripped(without_leading_space(word));
    std::vector<int32_t> first = tokenizer_.encode(stripped, false);
    std::vector<int32_t> later = tokenizer_.encode(" " + stripped, false);
    if (first.empty()) bad_request("bad_words: '" + word + "' encodes to no tokens", "bad_words");
    if (!later.empty() && later.front() != first.front() && later.size() == first.size())
      sequences.push_back(std::move(later));
    sequences.push_back(std::move(first));
  }
  return sequences;
}

// vLLM's X-Request-Id: the header, where given, names the answer over the body's request_id.
void ApiService::take_request_id_header(const HttpRequest& request, SamplingFields& sampling) {
  const std::string header = request.header("x-request-id");
  if (!header.empty()) sampling.request_id = checked_request_id(header, "X-Request-Id");
}

// As vLLM warns of fields a request holds that it does not read.
// The names are the client's: each is cut to 64 bytes with control characters shown as '?', and
// at most 16 are listed, so that a request cannot write the log's lines.
void ApiService::log_ignored_fields(const SamplingFields& sampling, const char* path) {
  if (sampling.ignored_fields.empty()) return;
  constexpr size_t kMaxNames = 16, kMaxNameBytes = 64;
  std::string names;
  for (size_t i = 0; i < std::min(sampling.ignored_fields.size(), kMaxNames); ++i) {
    std::string name = sampling.ignored_fields[i].substr(0, kMaxNameBytes);
    for (char& c : name)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    names += (names.empty() ? "" : ", ") + name;
  }
  if (sampling.ignored_fields.size() > kMaxNames)
    names += " and " + std::to_string(sampling.ignored_fields.size() - kMaxNames) + " more";
  log::warning(std::string(path) + ": the request's fields " + names + " are not read by glmserve and were ignored");
}

uint64_t ApiService::next_seed() const {
  std::lock_guard lock(seed_mutex_);
  return seeds_();
}

engine::RequestParams ApiService::base_params(const SamplingFields& s, const std::vector<int32_t>& ids, bool chat,
                                              int index,
                                              const std::shared_ptr<structured::GrammarMatcher>& matcher) const {
  engine::RequestParams p;
  p.prompt_ids = ids;
  p.sampling.temperature = s.temperature.value_or(config_.default_temperature);
  if (p.sampling.temperature < 1e-5f) p.sampling.temperature = 0.0f;
  p.sampling.top_p = s.top_p.value_or(config_.default_top_p);
  p.sampling.top_k = std::max(0, s.top_k.value_or(config_.default_top_k));
  p.sampling.min_p = s.min_p.value_or(config_.default_min_p);
  p.sampling.seed = s.seed ? *s.seed + static_cast<uint64_t>(index) : next_seed();
  p.cache_salt = s.cache_salt;
  p.ignore_eos = s.ignore_eos;
  p.stop_token_ids = s.stop_token_ids;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.top_logprobs = s.logprobs;
  p.prompt_logprobs = s.prompt_logprobs;
  p.timeout_seconds = config_.request_timeout_seconds;
  const int max_len = backend_.max_model_len();
  const int prompt_len = static_cast<int>(ids.size());
  const std::string what = chat ? "messages" : "prompt";
  if (prompt_len >= max_len)
    throw ApiException{ApiError{400,
                                "This model's maximum context length is " + std::to_string(max_len) +
                                    " tokens. However, your request has " + std::to_string(prompt_len) +
                                    " input tokens. Please reduce the length of the input " + what + ".",
                                what, 0.0}};
  if (s.max_tokens) {
    if (prompt_len + *s.max_tokens > max_len && !s.max_tokens_to_context)
      throw ApiException{ApiError{
          400,
          "This model's maximum context length is " + std::to_string(max_len) + " tokens. However, you requested " +
              std::to_string(prompt_len + *s.max_tokens) + " tokens (" + std::to_string(prompt_len) + " in the " +
              what + ", " + std::to_string(*s.max_tokens) + " in the completion). Please reduce the length of the " +
              what + " or completion.",
          "max_tokens", 0.0}};
    p.max_tokens = std::min(*s.max_tokens, max_len - prompt_len);
  } else {
    p.max_tokens = chat ? max_len - prompt_len : std::min(config_.default_completion_max_tokens, max_len - prompt_len);
  }
  for (int32_t id : s.stop_token_ids)
    if (id >= backend_.vocab_size())
      bad_request("stop_token_ids: " + std::to_string(id) + " is outside the vocabulary (size " +
                      std::to_string(backend_.vocab_size()) + ")",
                  "stop_token_ids");
  for (const auto& [id, bias] : s.logit_bias)
    if (id >= backend_.vocab_size())
      bad_request("logit_bias: " + std::to_string(id) + " is outside the vocabulary (size " +
                      std::to_string(backend_.vocab_size()) + ")",
                  "logit_bias");
  p.logit_bias = s.logit_bias;
  if (s.allowed_token_ids) {
    for (int32_t id : *s.allowed_token_ids)
      if (id >= backend_.vocab_size())
        bad_request("allowed_token_ids: " + std::to_string(id) + " is outside the vocabulary (size " +
                        std::to_string(backend_.vocab_size()) + ")",
                    "allowed_token_ids");
    p.allowed_token_ids = *s.allowed_token_ids;
  }
  p.min_tokens = std::min(s.min_tokens, p.max_tokens);
  if (matcher) p.constraint = structured::make_grammar_constraint(matcher);
  return p;
}

std::shared_ptr<structured::GrammarMatcher> ApiService::structured_matcher(const SamplingFields& s, const ChatRequest* chat,
                                                                           bool opens_reasoning) const {
  const bool forced_call = chat && (chat->tool_choice == "required" || chat->tool_choice == "function");
  std::string key, param = "structured_outputs";
  if (!s.choice.empty()) key = "choice:" + nlohmann::json(s.choice).dump();
  else if (!s.regex.empty()) key = "regex:" + s.regex, param = "structured_outputs.regex";
  else if (s.json_object) key = "json_object";
  else if (s.json_schema) key = "json:" + s.json_schema->dump(), param = s.json_schema_param;
  else if (!s.grammar.empty()) key = "grammar:" + s.grammar, param = "structured_outputs.grammar";
  else if (s.structural_tag)
    key = std::string("structural_tag:") + (opens_reasoning ? "think:" : "") + s.structural_tag->dump(),
    param = s.structural_tag_param;
  else if (forced_call)
    key = "tools:" + chat->tool_function + (chat->parallel_tool_calls ? ":parallel:" : ":one:") +
          (opens_reasoning ? "think:" : ":") + chat->tools_in_order->dump(),
    param = "tool_choice";
  else return nullptr;
  {
    std::lock_guard<std::mutex> lock(grammar_mutex_);
    const auto it = matchers_.find(key);
    if (it != matchers_.end()) {
      // A matcher that stopped growing is replaced for new requests; old ones keep theirs.
      if (it->second->full()) it->second = std::make_shared<structured::GrammarMatcher>(it->second->grammar(), vocabulary_);
      return it->second;
    }
  }
  std::shared_ptr<const structured::Grammar> grammar;
  try {
    if (!s.choice.empty()) grammar = structured::choice_grammar(s.choice);
    else if (!s.regex.empty()) grammar = structured::regex_grammar(s.regex);
    else if (s.json_object) grammar = structured::json_schema_grammar(nlohmann::ordered_json{{"type", "object"}});
    else if (s.json_schema) grammar = structured::json_schema_grammar(*s.json_schema);
    else if (!s.grammar.empty()) grammar = structured::parse_gbnf(s.grammar);
    else if (s.structural_tag) grammar = structured::structural_tag_grammar(*s.structural_tag, opens_reasoning);
    else grammar = structured::tool_call_grammar(*chat->tools_in_order, {chat->tool_function, chat->parallel_tool_calls, opens_reasoning});
  } catch (const Error& e) {
    bad_request(e.what(), param);
  }
  auto matcher = std::make_shared<structured::GrammarMatcher>(std::move(grammar), vocabulary_);
  std::lock_guard<std::mutex> lock(grammar_mutex_);
  if (matchers_.size() >= 16) matchers_.clear();
  matchers_.emplace(key, matcher);
  return matcher;
}

}  // namespace glms::server

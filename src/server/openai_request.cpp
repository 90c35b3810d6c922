// OpenAI request parsing and validation (see openai_request.h for the contract).
#include "server/openai_request.h"
#include "text/utf8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <span>
#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace glms::server {

using nlohmann::json;

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
    default: return "number";
  }
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
  bad_request(field + ": expected " + expected + ", got " + type_name(v), field);
}

// Field access helpers: each returns nullptr / nullopt when the field is absent or null.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const json& obj, const char* name, double lo, double hi) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_request(std::string(name) + " must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " +
                    v->dump(), name);
  return x;
}

std::optional<int64_t> get_int(const json& obj, const std::string& name, int64_t lo, int64_t hi) {
  const json* v = field(obj, name.c_str());
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad_request(name + " is too large", name);
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18) wrong_type(name, "an integer", *v);
    x = static_cast<int64_t>(d);
  } else {
    wrong_type(name, "an integer", *v);
  }
  if (x < lo || x > hi)
    bad_request(name + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                    std::to_string(x), name);
  return x;
}

std::optional<bool> get_bool(const json& obj, const char* name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const std::string& name) {
  const json* v = field(obj, name.c_str());
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(name, "a string", *v);
  return v->get<std::string>();
}

json parse_body(std::string_view body, int max_depth) {
  check_body_text(body, max_depth);
  json doc;
  try {
    doc = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    bad_request(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) bad_request(std::string("request body must be a JSON object, got ") + type_name(doc));
  return doc;
}

// JSON written inside a string field (a schema or structural tag as text), parsed in key order
// (discarded when it is not JSON). It is checked first as the body is (valid UTF-8, nesting within
// max_depth), which did not look inside strings: the schema compiler and serializer recurse over
// the nesting. A 400 naming `name` else.
nlohmann::ordered_json json_of_text(const std::string& text, const std::string& name, int max_depth) {
  try {
    check_body_text(text, max_depth);
  } catch (const ApiException& e) {
    bad_request(name + ": " + e.error.message, name);
  }
  return nlohmann::ordered_json::parse(text, nullptr, false);
}

// The value at `path` in the body, read again in key order (a schema's properties are written in
// the order given).
std::shared_ptr<const nlohmann::ordered_json> in_key_order(std::string_view body, const std::vector<std::string>& path) {
  nlohmann::ordered_json at = nlohmann::ordered_json::parse(body);
  for (const std::string& key : path) at = nlohmann::ordered_json(at[key]);
  return std::make_shared<const nlohmann::ordered_json>(std::move(at));
}

// A JSON schema given as `name` (at `path` in the body), for structured output: read again from the
// body in key order, as the order of its properties is the order the output writes them in.
void take_schema(const json& schema, std::string_view body, const std::vector<std::string>& path,
                 const std::string& name, SamplingFields& s, int max_depth) {
  if (s.json_schema) bad_request("give one structured output, once", name);
  s.json_schema_param = name;
  if (schema.is_string()) {
    auto parsed = json_of_text(schema.get<std::string>(), name, max_depth);
    if (parsed.is_discarded()) bad_request(name + " is a string but not JSON", name);
    s.json_schema = std::make_shared<const nlohmann::ordered_json>(std::move(parsed));
    return;
  }
  if (!schema.is_object() && !schema.is_boolean()) wrong_type(name, "a JSON schema (an object)", schema);
  s.json_schema = in_key_order(body, path);
}

// The sampling fields of a request: model, lengths, temperature and the other numbers, the
// stream's options.
void parse_sampling_numbers(const json& doc, SamplingFields& s, const ParseLimits& limits) {
  if (auto v = get_string(doc, "model")) s.model = *v;
  if (auto v = get_string(doc, "cache_salt")) {
    if (v->empty()) bad_request("cache_salt must be a non-empty string", "cache_salt");
    s.cache_salt = *v;
  }
  if (auto v = get_string(doc, "request_id")) s.request_id = checked_request_id(*v, "request_id");
  constexpr int64_t kMaxTokens = 1 << 30;
  if (auto v = get_int(doc, "max_tokens", 1, kMaxTokens)) s.max_tokens = static_cast<int>(*v);
  if (auto v = get_int(doc, "max_completion_tokens", 1, kMaxTokens)) s.max_tokens = static_cast<int>(*v);
  if (auto v = get_number(doc, "temperature", 0.0, 100.0)) s.temperature = static_cast<float>(*v);
  if (auto v = get_number(doc, "top_p", 0.0, 1.0)) {
    if (*v <= 0.0) bad_request("top_p must be in (0, 1], got " + json(*v).dump(), "top_p");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(doc, "top_k", -1, 1 << 30)) s.top_k = static_cast<int>(*v);
  if (auto v = get_number(doc, "min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*v);
  if (auto v = get_int(doc, "seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (auto v = get_int(doc, "n", 1, limits.max_n)) s.n = static_cast<int>(*v);
  if (auto v = get_number(doc, "presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(doc, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_number(doc, "repetition_penalty", 0.0, 100.0)) {
    if (*v <= 0.0) bad_request("repetition_penalty must be > 0", "repetition_penalty");
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = get_bool(doc, "ignore_eos")) s.ignore_eos = *v;
  if (auto v = get_bool(doc, "stream")) s.stream = *v;
  if (auto v = get_bool(doc, "skip_special_tokens")) s.skip_special_tokens = *v;
  if (auto v = get_bool(doc, "include_stop_str_in_output")) s.include_stop_str_in_output = *v;

  if (const json* v = field(doc, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (!s.stream) bad_request("stream_options can only be set when stream is true", "stream_options");
    if (auto u = get_bool(*v, "include_usage")) s.include_usage = *u;
    if (auto u = get_bool(*v, "continuous_usage_stats")) s.continuous_usage_stats = *u;
  }
}

// stop (strings) and stop_token_ids.
void parse_stops(const json& doc, SamplingFields& s, const ParseLimits& limits) {
  if (const json* v = field(doc, "stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& item : *v) {
        if (!item.is_string()) wrong_type("stop", "a string or an array of strings", item);
        s.stop.push_back(item.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *v);
    }
    if (static_cast<int>(s.stop.size()) > limits.max_stop_strings)
      bad_request("stop: at most " + std::to_string(limits.max_stop_strings) + " stop strings", "stop");
    for (const std::string& str : s.stop)
      if (str.empty()) bad_request("stop: stop strings must not be empty", "stop");
  }
  if (const json* v = field(doc, "stop_token_ids")) {
    if (!v->is_array()) wrong_type("stop_token_ids", "an array of integers", *v);
    for (const json& item : *v) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > INT32_MAX)
        bad_request("stop_token_ids: expected non-negative token ids, got " + item.dump(), "stop_token_ids");
      s.stop_token_ids.push_back(item.get<int32_t>());
    }
  }
}

// A structural tag (vLLM's): an object, or its JSON text (structured_outputs.structural_tag is a
// string in vLLM), kept in the request's key order (its schemas' properties keep theirs).
void take_structural_tag(const json& value, std::string_view body, const std::vector<std::string>& path,
                         const std::string& name, SamplingFields& s, int max_depth) {
  if (s.structural_tag) bad_request("give one structured output, once", name);
  s.structural_tag_param = name;
  if (value.is_string()) {
    auto parsed = json_of_text(value.get<std::string>(), name, max_depth);
    if (!parsed.is_object()) bad_request(name + " is a string but not a JSON object", name);
    s.structural_tag = std::make_shared<const nlohmann::ordered_json>(std::move(parsed));
    return;
  }
  if (!value.is_object()) wrong_type(name, "an object with structures and triggers", value);
  s.structural_tag = in_key_order(body, path);
}

// response_format: text, json_object, json_schema or structural_tag.
void parse_response_format(const json& doc, std::string_view body, SamplingFields& s, int max_depth) {
  if (const json* v = field(doc, "response_format")) {
    if (!v->is_object()) wrong_type("response_format", "an object", *v);
    const auto type = get_string(*v, "type");
    if (type && *type == "json_object") {
      s.json_object = true;
    } else if (type && *type == "json_schema") {
      const json* spec = field(*v, "json_schema");
      if (!spec || !spec->is_object()) bad_request("response_format.json_schema must be an object", "response_format.json_schema");
      const json* schema = field(*spec, "schema");
      if (!schema) bad_request("response_format.json_schema.schema is required", "response_format.json_schema.schema");
      take_schema(*schema, body, {"response_format", "json_schema", "schema"}, "response_format.json_schema.schema", s,
                  max_depth);
    } else if (type && *type == "structural_tag") {
      take_structural_tag(*v, body, {"response_format"}, "response_format", s, max_depth);
    } else if (type && *type != "text") {
      bad_request("response_format type '" + *type +
                      "' is not supported (text, json_object, json_schema and structural_tag are)",
                  "response_format");
    }
  }
}

// allowed_token_ids and bad_words (vLLM's): which tokens may be drawn.
void parse_token_filters(const json& doc, SamplingFields& s, const ParseLimits& limits) {
  if (const json* v = field(doc, "allowed_token_ids")) {
    if (!v->is_array()) wrong_type("allowed_token_ids", "an array of token ids", *v);
    if (v->empty()) bad_request("allowed_token_ids must not be empty (leave it out to allow every token)", "allowed_token_ids");
    std::vector<int32_t> ids;
    for (const json& item : *v) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > INT32_MAX)
        bad_request("allowed_token_ids: expected non-negative token ids, got " + item.dump(), "allowed_token_ids");
      ids.push_back(item.get<int32_t>());
    }
    s.allowed_token_ids = std::move(ids);
  }
  if (const json* v = field(doc, "bad_words")) {
    if (!v->is_array()) wrong_type("bad_words", "an array of strings", *v);
    for (const json& item : *v) {
      if (!item.is_string()) wrong_type("bad_words", "an array of strings", item);
      s.bad_words.push_back(item.get<std::string>());
    }
    if (static_cast<int>(s.bad_words.size()) > limits.max_bad_words)
      bad_request("bad_words: at most " + std::to_string(limits.max_bad_words) + " words", "bad_words");
    for (const std::string& word : s.bad_words)
      if (word.find_first_not_of(" \t\n\r") == std::string::npos)
        bad_request("bad_words: a word must hold more than whitespace", "bad_words");
  }
}

// logit_bias, min_tokens and best_of.
void parse_bias_and_lengths(const json& doc, SamplingFields& s, const ParseLimits& limits) {
  if (const json* v = field(doc, "logit_bias")) {
    if (!v->is_object()) wrong_type("logit_bias", "an object of token id -> bias", *v);
    for (const auto& [key, bias] : v->items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
        bad_request("logit_bias: '" + key + "' is not a token id", "logit_bias");
      if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::fabs(bias.get<double>()) > 100.0)
        bad_request("logit_bias: the bias of token " + key + " must be a number in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), bias.get<float>());
    }
  }
  if (auto v = get_int(doc, "min_tokens", 0, 1 << 30)) {
    s.min_tokens = static_cast<int>(*v);
    if (s.max_tokens && s.min_tokens > *s.max_tokens)
      bad_request("min_tokens (" + std::to_string(s.min_tokens) + ") must not exceed max_tokens (" +
                      std::to_string(*s.max_tokens) + ")",
                  "min_tokens");
  }
  if (auto v = get_int(doc, "truncate_prompt_tokens", -1, 1 << 30)) {
    if (*v == 0) bad_request("truncate_prompt_tokens must be -1 (the model's length) or at least 1", "truncate_prompt_tokens");
    s.truncate_prompt_tokens = static_cast<int>(*v);
  }
  if (get_bool(doc, "use_beam_search").value_or(false))
    bad_request("use_beam_search: glmserve has no beam search (sample n choices instead)", "use_beam_search");
  if (auto v = get_int(doc, "best_of", 1, limits.max_n)) {
    if (*v < s.n) bad_request("best_of must be at least n", "best_of");
    if (*v > s.n)
      bad_request("best_of larger than n is not supported: glmserve returns every sequence it generates (set n to " +
                      std::to_string(*v) + " and pick among the choices)",
                  "best_of");
  }
}

// The structured outputs of vLLM's request forms: guided_choice / _regex / _grammar / _json, or
// structured_outputs with the same kinds; one form at most, with response_format's.
void parse_structured_outputs(const json& doc, std::string_view body, SamplingFields& s, int max_depth) {
  // Structured outputs: the choice form (vLLM's structured_outputs.choice, or guided_choice).
  auto parse_choice = [&](const json& v, const std::string& name) {
    if (!v.is_array() || v.empty()) wrong_type(name, "a non-empty array of strings", v);
    for (const json& item : v) {
      if (!item.is_string() || item.get<std::string>().empty()) wrong_type(name, "a non-empty array of non-empty strings", v);
      s.choice.push_back(item.get<std::string>());
    }
  };
  auto parse_regex = [&](const json& v, const std::string& name) {
    if (!v.is_string() || v.get<std::string>().empty()) wrong_type(name, "a non-empty string", v);
    s.regex = v.get<std::string>();
  };
  auto parse_grammar = [&](const json& v, const std::string& name) {
    if (!v.is_string() || v.get<std::string>().empty()) wrong_type(name, "a non-empty string (GBNF)", v);
    s.grammar = v.get<std::string>();
  };
  int guided_fields = 0;
  if (const json* v = field(doc, "guided_choice")) parse_choice(*v, "guided_choice"), ++guided_fields;
  if (const json* v = field(doc, "guided_regex")) parse_regex(*v, "guided_regex"), ++guided_fields;
  if (const json* v = field(doc, "guided_grammar")) parse_grammar(*v, "guided_grammar"), ++guided_fields;
  if (const json* v = field(doc, "guided_json"))
    take_schema(*v, body, {"guided_json"}, "guided_json", s, max_depth), ++guided_fields;
  if (const json* v = field(doc, "structured_outputs")) {
    if (!v->is_object()) wrong_type("structured_outputs", "an object", *v);
    if (guided_fields) bad_request("give one structured output, once (structured_outputs or guided_*)", "structured_outputs");
    for (const auto& [key, value] : v->items()) {
      if (key == "choice") parse_choice(value, "structured_outputs.choice");
      else if (key == "regex") parse_regex(value, "structured_outputs.regex");
      else if (key == "structural_tag")
        take_structural_tag(value, body, {"structured_outputs", "structural_tag"}, "structured_outputs.structural_tag", s,
                            max_depth);
      else if (key == "grammar") parse_grammar(value, "structured_outputs.grammar");
      else if (key == "json")
        take_schema(value, body, {"structured_outputs", "json"}, "structured_outputs.json", s, max_depth);
      else if (key == "json_object") {
        if (!value.is_boolean()) wrong_type("structured_outputs.json_object", "a boolean", value);
        s.json_object = s.json_object || value.get<bool>();
      }
      else
        bad_request("structured_outputs." + key +
                        " is not supported by glmserve (choice, regex, json, grammar, json_object and structural_tag are)",
                    "structured_outputs." + key);
    }
  }
  if (s.structured_forms() > 1)
    bad_request("give one structured output (choice, regex, json, grammar, json_object or structural_tag), once",
                "structured_outputs");
}

// Fields refused by name, prompt_logprobs, user, and logprobs in the completions or the chat form.
void parse_logprobs(const json& doc, SamplingFields& s, const ParseLimits& limits, bool chat) {
  // Fields glmserve does not implement yet: refused by name rather than ignored.
  for (const char* name : {"guided_decoding_backend",
                           "guided_whitespace_pattern", "suffix", "logits_processors", "prompt_embeds"})
    if (field(doc, name))
      bad_request(std::string(name) + " is not supported by glmserve yet (docs/api.md lists the fields it takes)", name);
  if (const json* v = field(doc, "prompt_logprobs"); v && !v->is_null()) {
    s.prompt_logprobs = static_cast<int>(*get_int(doc, "prompt_logprobs", 0, limits.max_top_logprobs));
    if (get_bool(doc, "stream").value_or(false))
      bad_request("prompt_logprobs is not supported with stream: true (glmserve sends them in the whole response)",
                  "prompt_logprobs");
  }
  if (const json* v = field(doc, "user"); v && !v->is_string()) wrong_type("user", "a string", *v);
  s.tokens_as_ids = get_bool(doc, "return_tokens_as_token_ids");
  s.return_token_ids = get_bool(doc, "return_token_ids").value_or(false);
  if (chat) s.include_reasoning = get_bool(doc, "include_reasoning").value_or(true);
  if (const json* v = field(doc, "priority"); v && !v->is_null() && !(v->is_number_integer() && *v == 0))
    bad_request("priority: requests are scheduled first come, first served (vLLM's default policy, fcfs, refuses a "
                "priority too)",
                "priority");
  if (!chat) {
    if (auto v = get_int(doc, "logprobs", 0, limits.max_top_logprobs)) s.logprobs = static_cast<int>(*v);
  } else {
    const bool want = get_bool(doc, "logprobs").value_or(false);
    const auto top = get_int(doc, "top_logprobs", 0, limits.max_top_logprobs);
    if (top && !want) bad_request("top_logprobs needs logprobs: true", "top_logprobs");
    if (want) s.logprobs = static_cast<int>(top.value_or(0));
  }
}

// The top-level fields both parsers read or refuse by name, then each one's own, then vLLM's that
// are accepted with no effect here (docs/api.md): any other field is reported as ignored.
constexpr std::string_view kSamplingFields[] = {
    "model", "cache_salt", "request_id", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "stream",
    "skip_special_tokens", "include_stop_str_in_output", "stream_options", "stop", "stop_token_ids",
    "response_format", "logit_bias", "min_tokens", "truncate_prompt_tokens", "use_beam_search", "best_of",
    "allowed_token_ids", "bad_words", "guided_choice", "guided_regex", "guided_grammar", "guided_json",
    "structured_outputs", "guided_decoding_backend", "guided_whitespace_pattern", "suffix", "logits_processors",
    "prompt_logprobs", "user", "return_tokens_as_token_ids", "return_token_ids", "priority", "logprobs",
    "add_special_tokens", "echo", "functions", "function_call", "prompt_embeds"};
constexpr std::string_view kChatFields[] = {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "chat_template", "include_reasoning", "top_logprobs", "prompt"};
constexpr std::string_view kCompletionFields[] = {"prompt", "messages"};
constexpr std::string_view kFieldsWithNoEffect[] = {
    "length_penalty", "early_stopping", "spaces_between_special_tokens", "documents", "mm_processor_kwargs",
    "kv_transfer_params", "vllm_xargs"};

std::vector<std::string> ignored_fields(const json& doc, std::span<const std::string_view> own) {
  auto listed = [](std::span<const std::string_view> names, const std::string& key) {
    return std::find(names.begin(), names.end(), key) != names.end();
  };
  std::vector<std::string> ignored;
  for (const auto& [key, value] : doc.items())
    if (!listed(kSamplingFields, key) && !listed(own, key) && !listed(kFieldsWithNoEffect, key)) ignored.push_back(key);
  return ignored;
}

void parse_sampling(const json& doc, std::string_view body, SamplingFields& s, const ParseLimits& limits, bool chat) {
  parse_sampling_numbers(doc, s, limits);
  parse_stops(doc, s, limits);
  parse_response_format(doc, body, s, limits.max_json_depth);
  parse_bias_and_lengths(doc, s, limits);
  parse_token_filters(doc, s, limits);
  parse_structured_outputs(doc, body, s, limits.max_json_depth);
  parse_logprobs(doc, s, limits, chat);
  for (const char* name : {"functions", "function_call"})
    if (const json* v = field(doc, name); v && !(v->is_array() && v->empty()))
      bad_request(std::string(name) + " is OpenAI's deprecated form of function calling: give tools and tool_choice",
                  name);
  s.add_special_tokens = get_bool(doc, "add_special_tokens").value_or(!chat);
  s.ignored_fields = ignored_fields(doc, chat ? std::span<const std::string_view>(kChatFields)
                                              : std::span<const std::string_view>(kCompletionFields));
}

// Validates OpenAI content: a string, null, or a list of text parts, which the chat template
// gets as a list of {"type": "text", "text"} (as Hugging Face passes it: GLM's template
// concatenates the parts).
json normalise_content(const json& content, const std::string& where) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) wrong_type(where, "a string or an array of content parts", content);
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (part.is_string()) {
      parts.push_back({{"type", "text"}, {"text", part.get<std::string>()}});
      continue;
    }
    if (!part.is_object()) wrong_type(at, "a content part object", part);
    const auto type = get_string(part, "type");
    if (!type) bad_request(at + ".type is required", at + ".type");
    if (*type != "text") bad_request(at + ": content part type '" + *type + "' is not supported (only 'text')", at + ".type");
    const auto value = get_string(part, "text");
    if (!value) bad_request(at + ".text is required", at + ".text");
    parts.push_back({{"type", "text"}, {"text", *value}});
  }
  return parts;
}

// The text of the final message when it is the assistant's (its text parts joined by newlines,
// as vLLM's echo joins them), else "".
std::string final_assistant_text(const json& messages) {
  if (messages.empty() || messages.back()["role"] != "assistant") return "";
  const json& content = messages.back()["content"];
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array())
    for (size_t i = 0; i < content.size(); ++i) text += (i > 0 ? "\n" : "") + content[i]["text"].get<std::string>();
  return text;
}

json normalise_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) wrong_type(where, "an array", calls);
  json out = json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& call = calls[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!call.is_object()) wrong_type(at, "an object", call);
    json norm = json::object();
    if (auto id = get_string(call, "id")) norm["id"] = *id;
    norm["type"] = get_string(call, "type").value_or("function");
    const json* fn = field(call, "function");
    if (!fn || !fn->is_object()) bad_request(at + ".function must be an object", at + ".function");
    const auto name = get_string(*fn, "name");
    if (!name) bad_request(at + ".function.name is required", at + ".function.name");
    json args = json::object();
    if (const json* a = field(*fn, "arguments")) {
      if (a->is_object()) {
        args = *a;
      } else if (a->is_string()) {
        // Templates iterate the arguments as a mapping (vLLM parses them the same way).
        // A string is not depth-checked with the body: a deeply nested document inside one
        // would overflow the stack of whatever recurses over it later (dump, the template).
        constexpr int kMaxArgumentDepth = 64;
        check_body_text(a->get_ref<const std::string&>(), kMaxArgumentDepth);
        try {
          args = json::parse(a->get<std::string>());
        } catch (const json::exception&) {
          bad_request(at + ".function.arguments is not valid JSON", at + ".function.arguments");
        }
        if (!args.is_object()) bad_request(at + ".function.arguments must encode a JSON object", at + ".function.arguments");
      } else {
        wrong_type(at + ".function.arguments", "a JSON string or an object", *a);
      }
    }
    norm["function"] = {{"name", *name}, {"arguments", std::move(args)}};
    out.push_back(std::move(norm));
  }
  return out;
}

json parse_messages(const json& doc) {
  const json* msgs = field(doc, "messages");
  if (!msgs) bad_request("messages is required", "messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad_request("messages must not be empty", "messages");
  json out = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(at, "an object", m);
    std::optional<std::string> r;
    if (const json* rv = field(m, "role")) {
      if (!rv->is_string()) wrong_type(at + ".role", "a string", *rv);
      r = rv->get<std::string>();
    }
    if (!r) bad_request(at + ".role is required", at + ".role");
    std::string role_name = *r;
    if (role_name == "developer") role_name = "system";
    if (role_name != "system" && role_name != "user" && role_name != "assistant" && role_name != "tool")
      bad_request(at + ".role '" + *r + "' is not one of system, developer, user, assistant, tool", at + ".role");
    json norm = {{"role", role_name}};
    const json* content = m.contains("content") ? &m["content"] : nullptr;
    norm["content"] = content ? normalise_content(*content, at + ".content") : json(nullptr);
    if (role_name != "assistant" && norm["content"].is_null())
      bad_request(at + ".content is required for role " + *r, at + ".content");
    if (const json* v = field(m, "name")) {
      if (!v->is_string()) wrong_type(at + ".name", "a string", *v);
      norm["name"] = *v;
    }
    if (role_name == "assistant") {
      if (const json* v = field(m, "tool_calls")) norm["tool_calls"] = normalise_tool_calls(*v, at + ".tool_calls");
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (const json* v = field(m, key)) {
          if (!v->is_string()) wrong_type(at + "." + key, "a string", *v);
          norm["reasoning_content"] = *v;
        }
      }
    }
    if (role_name == "tool") {
      if (const json* v = field(m, "tool_call_id")) {
        if (!v->is_string()) wrong_type(at + ".tool_call_id", "a string", *v);
        norm["tool_call_id"] = *v;
      }
    }
    out.push_back(std::move(norm));
  }
  return out;
}

json parse_tools(const json& doc) {
  const json* tools = field(doc, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) wrong_type("tools", "an array", *tools);
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) wrong_type(at, "an object", t);
    const auto type = get_string(t, "type").value_or("function");
    if (type != "function") bad_request(at + ".type '" + type + "' is not supported (only 'function')", at + ".type");
    const json* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad_request(at + ".function must be an object", at + ".function");
    if (!get_string(*fn, "name")) bad_request(at + ".function.name is required", at + ".function.name");
    if (const json* p = field(*fn, "parameters"); p && !p->is_object())
      wrong_type(at + ".function.parameters", "an object", *p);
    if (const json* d = field(*fn, "description"); d && !d->is_string())
      wrong_type(at + ".function.description", "a string", *d);
  }
  return tools->empty() ? json(nullptr) : *tools;
}

// tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name"}}, which
// sets `function` to the name (and returns "function"). A forced call must name an offered tool.
// As vLLM (and OpenAI), "auto" and "required" over an empty tools array mean "none"; without a
// tools field they are a 400.
std::string parse_tool_choice(const json& doc, const json& tools, std::string& function) {
  const bool has_tools = !tools.is_null();
  const json* v = field(doc, "tool_choice");
  if (!v) return has_tools ? "auto" : "none";
  if (v->is_string()) {
    const std::string choice = v->get<std::string>();
    if (choice != "none" && choice != "auto" && choice != "required")
      bad_request("tool_choice must be 'none', 'auto', 'required' or a named function, got '" + choice + "'",
                  "tool_choice");
    if (choice != "none" && !has_tools) {
      if (const json* given = field(doc, "tools"); given && given->is_array() && given->empty()) return "none";
      bad_request("tool_choice '" + choice + "' needs tools", "tool_choice");
    }
    return choice;
  }
  if (!v->is_object()) wrong_type("tool_choice", "a string or an object", *v);
  const json* fn = field(*v, "function");
  if (!fn || !fn->is_object()) bad_request("tool_choice.function must be an object", "tool_choice.function");
  const auto name = get_string(*fn, "name");
  if (!name) bad_request("tool_choice.function.name is required", "tool_choice.function.name");
  if (!has_tools) bad_request("a named tool_choice needs tools", "tool_choice");
  for (const json& t : tools)
    if (t["function"]["name"] == *name) {
      function = *name;
      return "function";
    }
  bad_request("tool_choice names function '" + *name + "', which is not among the tools", "tool_choice.function.name");
}

}  // namespace

std::string checked_request_id(const std::string& id, const std::string& param) {
  constexpr size_t kMaxLength = 256;
  if (id.empty() || id.size() > kMaxLength)
    bad_request(param + " must hold 1 to " + std::to_string(kMaxLength) + " characters", param);
  for (const unsigned char c : id)
    if (c < 0x20 || c == 0x7f) bad_request(param + " may not hold control characters", param);
  return id;
}

bool is_valid_utf8(std::string_view s) { return text::utf8::is_valid(s); }

void check_body_text(std::string_view body, int max_depth) {
  if (!is_valid_utf8(body)) bad_request("request body is not valid UTF-8");
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) bad_request("request JSON is nested deeper than " + std::to_string(max_depth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

ChatRequest parse_chat_request(std::string_view body, const ParseLimits& limits) {
  const json doc = parse_body(body, limits.max_json_depth);
  ChatRequest req;
  parse_sampling(doc, body, req.sampling, limits, true);
  req.messages = std::make_shared<const json>(parse_messages(doc));
  json tools = parse_tools(doc);
  req.tool_choice = parse_tool_choice(doc, tools, req.tool_function);
  if (auto v = get_bool(doc, "parallel_tool_calls")) req.parallel_tool_calls = *v;
  if (req.tool_choice == "required" || req.tool_choice == "function") {
    if (req.sampling.structured_forms() > 0)
      bad_request("tool_choice '" + req.tool_choice + "' and a structured output cannot be combined", "tool_choice");
    req.tools_in_order = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::parse(body)["tools"]);
  }
  req.tools = std::make_shared<const json>(std::move(tools));
  json kwargs = json::object();
  if (const json* v = field(doc, "chat_template_kwargs")) {
    if (!v->is_object()) wrong_type("chat_template_kwargs", "an object", *v);
    kwargs = *v;
  }
  req.template_kwargs = std::make_shared<const json>(std::move(kwargs));
  if (auto v = get_bool(doc, "add_generation_prompt")) req.add_generation_prompt = *v;
  if (auto v = get_bool(doc, "continue_final_message")) req.continue_final_message = *v;
  if (auto v = get_string(doc, "chat_template")) {
    if (v->empty()) bad_request("chat_template must not be empty", "chat_template");
    req.chat_template = *v;
  }
  if (req.continue_final_message && req.add_generation_prompt && field(doc, "add_generation_prompt"))
    bad_request("continue_final_message and add_generation_prompt cannot both be true", "continue_final_message");
  if (req.continue_final_message) req.add_generation_prompt = false;
  if (field(doc, "prompt")) bad_request("chat completions take messages, not prompt", "prompt");
  if (get_bool(doc, "echo").value_or(false)) req.echo_text = final_assistant_text(*req.messages);
  return req;
}

CompletionRequest parse_completion_request(std::string_view body, const ParseLimits& limits) {
  const json doc = parse_body(body, limits.max_json_depth);
  CompletionRequest req;
  parse_sampling(doc, body, req.sampling, limits, false);
  if (auto v = get_bool(doc, "echo")) req.echo = *v;
  if (req.echo && req.sampling.logprobs >= 0 && req.sampling.stream)
    bad_request("echo with logprobs is not supported with stream: true (the prompt's logprobs come in the whole response)",
                "echo");
  const json* p = field(doc, "prompt");
  if (!p) bad_request("prompt is required", "prompt");
  auto id_list = [](const json& arr, const std::string& at) {
    std::vector<int32_t> ids;
    for (const json& item : arr) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > INT32_MAX)
        bad_request(at + ": token ids must be non-negative integers, got " + item.dump(), "prompt");
      ids.push_back(item.get<int32_t>());
    }
    return ids;
  };
  if (p->is_string()) {
    req.prompts.emplace_back(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad_request("prompt must not be empty", "prompt");
    if ((*p)[0].is_number()) {
      req.prompts.emplace_back(id_list(*p, "prompt"));
    } else {
      for (size_t i = 0; i < p->size(); ++i) {
        const json& item = (*p)[i];
        const std::string at = "prompt[" + std::to_string(i) + "]";
        if (item.is_string()) req.prompts.emplace_back(item.get<std::string>());
        else if (item.is_array()) req.prompts.emplace_back(id_list(item, at));
        else wrong_type(at, "a string or an array of token ids", item);
      }
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *p);
  }
  if (req.prompts.size() * static_cast<size_t>(req.sampling.n) > static_cast<size_t>(limits.max_n) * 4)
    bad_request("too many prompts x n in one request (at most " + std::to_string(limits.max_n * 4) + ")", "prompt");
  for (const Prompt& prompt : req.prompts) {
    const bool empty = std::visit([](const auto& x) { return x.empty(); }, prompt);
    if (empty) bad_request("prompt must not be empty", "prompt");
  }
  if (field(doc, "messages")) bad_request("completions take prompt, not messages", "messages");
  return req;
}

}  // namespace glms::server

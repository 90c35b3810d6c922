#include "server/sglang_generate.h"

#include <map>
#include <vector>

#include "server/chat_adapter.h"

namespace glms::server {

namespace {

using adapter::dump;
using adapter::json;

// sampling_params keys and the completions field each becomes; structured outputs go under
// structured_outputs.
const std::map<std::string, std::string>& sampling_fields() {
  static const std::map<std::string, std::string> fields = {
      {"max_new_tokens", "max_tokens"},   {"min_new_tokens", "min_tokens"},
      {"stop", "stop"},                   {"stop_token_ids", "stop_token_ids"},
      {"temperature", "temperature"},     {"top_p", "top_p"},
      {"top_k", "top_k"},                 {"min_p", "min_p"},
      {"frequency_penalty", "frequency_penalty"}, {"presence_penalty", "presence_penalty"},
      {"repetition_penalty", "repetition_penalty"}, {"ignore_eos", "ignore_eos"},
      {"skip_special_tokens", "skip_special_tokens"}, {"n", "n"},
      {"sampling_seed", "seed"},          {"no_stop_trim", "include_stop_str_in_output"},
      {"logit_bias", "logit_bias"}};
  return fields;
}

const std::map<std::string, std::string>& structured_fields() {
  static const std::map<std::string, std::string> fields = {
      {"json_schema", "json"}, {"regex", "regex"}, {"ebnf", "grammar"}, {"structural_tag", "structural_tag"}};
  return fields;
}

void take_sampling_params(const json& params, json& req) {
  if (!params.is_object()) bad_request("sampling_params must be an object (one for every prompt)", "sampling_params");
  for (const auto& [key, value] : params.items()) {
    if (value.is_null()) continue;
    if (const auto it = sampling_fields().find(key); it != sampling_fields().end()) {
      req[it->second] = value;
    } else if (const auto st = structured_fields().find(key); st != structured_fields().end()) {
      req["structured_outputs"][st->second] = value;
    } else if (key != "spaces_between_special_tokens") {
      bad_request("sampling_params." + key + " is not supported by glmserve", "sampling_params." + key);
    }
  }
}

// text or input_ids: one prompt or a batch of them (the answer is then a list).
json prompt_of(const json& doc, bool& batch) {
  const bool has_text = doc.contains("text") && !doc["text"].is_null();
  const bool has_ids = doc.contains("input_ids") && !doc["input_ids"].is_null();
  if (has_text == has_ids) bad_request("give text or input_ids (one of them)", has_text ? "input_ids" : "text");
  const json& prompt = has_text ? doc["text"] : doc["input_ids"];
  const char* name = has_text ? "text" : "input_ids";
  if (!prompt.is_array()) {
    if (!has_text || !prompt.is_string()) bad_request(std::string(name) + " must be a string, a list, or token ids", name);
    return prompt;
  }
  batch = has_text || (!prompt.empty() && prompt[0].is_array());
  return prompt;
}

}  // namespace

GenerateRequest completion_request_of_generate(std::string_view body) {
  const json doc = adapter::parse_body(body);
  for (const char* name : {"image_data", "audio_data", "video_data", "input_embeds", "lora_path", "return_hidden_states",
                           "custom_logit_processor", "session_params", "token_ids_logprob"})
    if (doc.contains(name) && !doc[name].is_null())
      bad_request(std::string(name) + " is not supported by glmserve (it reads text or token ids)", name);
  GenerateRequest out;
  json req = json::object();
  req["prompt"] = prompt_of(doc, out.batch);
  req["max_tokens"] = 128;  // SGLang's default max_new_tokens
  if (doc.contains("sampling_params") && !doc["sampling_params"].is_null())
    take_sampling_params(doc["sampling_params"], req);
  if (req.contains("n")) {
    if (!req["n"].is_number_integer()) bad_request("sampling_params.n must be an integer", "sampling_params.n");
    out.n = req["n"].get<int>();
  }
  const bool stream = adapter::bool_field(doc, "stream", "");
  if (stream) req["stream_options"] = {{"include_usage", true}};
  req["stream"] = stream;
  req["return_token_ids"] = true;  // output_ids and the token counts of each answer
  out.logprobs = adapter::bool_field(doc, "return_logprob", "");
  if (out.logprobs) {
    int top = 0;
    if (doc.contains("top_logprobs_num") && !doc["top_logprobs_num"].is_null()) {
      if (!doc["top_logprobs_num"].is_number_integer()) bad_request("top_logprobs_num must be an integer", "top_logprobs_num");
      top = doc["top_logprobs_num"].get<int>();
    }
    req["logprobs"] = top;
    req["return_tokens_as_token_ids"] = true;  // SGLang's logprobs carry token ids
  }
  if (doc.contains("logprob_start_len") && !doc["logprob_start_len"].is_null() && doc["logprob_start_len"] != -1)
    bad_request("logprob_start_len: the prompt's logprobs are not returned by /generate here (-1 only); "
                "/v1/completions takes prompt_logprobs",
                "logprob_start_len");
  if (const std::string rid = adapter::string_field(doc, "rid", ""); !rid.empty()) req["request_id"] = rid;
  out.completion_request = dump(req);
  return out;
}

namespace {

// SGLang's finish_reason of a completions choice (`ids`: its tokens, the EOS included).
json finish_of(const json& choice, const json& ids) {
  const json& reason = choice.contains("finish_reason") ? choice["finish_reason"] : json(nullptr);
  if (reason.is_null()) return nullptr;
  if (reason == "length") return {{"type", "length"}, {"length", ids.size()}};
  if (reason == "stop") {
    const json& matched = choice.contains("stop_reason") ? choice["stop_reason"] : json(nullptr);
    return {{"type", "stop"}, {"matched", !matched.is_null() ? matched : ids.empty() ? json(nullptr) : ids.back()}};
  }
  return {{"type", "abort"}, {"message", reason}};
}

// The token id in a logprobs token named "token_id:N".
json id_of(const std::string& name) {
  return name.rfind("token_id:", 0) == 0 ? json(std::stoll(name.substr(9))) : json(nullptr);
}

// meta_info's output_token_logprobs ([[logprob, id, null]]) and output_top_logprobs.
void add_logprobs(const json& logprobs, json& meta) {
  json tokens = json::array(), tops = json::array();
  if (logprobs.is_object() && logprobs.contains("tokens")) {
    for (size_t i = 0; i < logprobs["tokens"].size(); ++i) {
      tokens.push_back({logprobs["token_logprobs"][i], id_of(logprobs["tokens"][i]), nullptr});
      json top = json::array();
      if (logprobs["top_logprobs"][i].is_object())
        for (const auto& [name, value] : logprobs["top_logprobs"][i].items()) top.push_back({value, id_of(name), nullptr});
      tops.push_back(std::move(top));
    }
  }
  meta["output_token_logprobs"] = std::move(tokens);
  meta["output_top_logprobs"] = std::move(tops);
}

// The answers as SGLang writes them: one object, or a list for a batch or n > 1.
std::string generate_of_completion(const std::string& completion, const GenerateRequest& request) {
  const json c = json::parse(completion);
  const std::string id = c.value("id", "").substr(c.value("id", "").find('-') + 1);
  const json& choices = c["choices"];
  const bool single_prompt = !request.batch;
  json out = json::array();
  for (const json& choice : choices) {
    const json ids = choice.value("token_ids", json::array());
    json meta = {{"id", choices.size() > 1 ? id + "_" + std::to_string(choice.value("index", 0)) : id},
                 {"finish_reason", finish_of(choice, ids)},
                 {"prompt_tokens", choice.value("prompt_token_ids", json::array()).size()},
                 {"completion_tokens", ids.size()}};
    if (single_prompt) meta["cached_tokens"] = c["usage"].value("prompt_tokens_details", json::object()).value("cached_tokens", 0);
    if (request.logprobs) add_logprobs(choice.value("logprobs", json(nullptr)), meta);
    out.push_back({{"text", choice.value("text", "")}, {"output_ids", ids}, {"meta_info", std::move(meta)}});
  }
  return dump(out.size() == 1 && !request.batch && request.n == 1 ? out[0] : out);
}

// A completions stream as SGLang's: each choice's chunk holds its whole text and ids so far; a
// choice's last chunk waits for the usage event (the prefix cache's count).
class GenerateStream {
 public:
  explicit GenerateStream(const GenerateRequest& request) : request_(request) {}

  std::string translate(const std::string& payload) {
    if (payload == "[DONE]") return flush(nullptr) + "data: [DONE]\n\n";
    const json chunk = json::parse(payload, nullptr, false);
    if (!chunk.is_object() || chunk.contains("error")) return "data: " + payload + "\n\n";
    if (id_.empty()) id_ = chunk.value("id", "").substr(chunk.value("id", "").find('-') + 1);
    if (chunk.contains("usage") && !chunk["usage"].is_null() && chunk.value("choices", json::array()).empty())
      return flush(&chunk["usage"]);
    std::string out;
    for (const json& choice : chunk.value("choices", json::array())) {
      const int index = choice.value("index", 0);
      Choice& c = choices_[index];
      c.text += choice.value("text", "");
      for (const json& t : choice.value("token_ids", json::array())) c.ids.push_back(t);
      if (choice.contains("prompt_token_ids")) c.prompt_tokens = choice["prompt_token_ids"].size();
      if (request_.logprobs) add_logprobs(choice.value("logprobs", json(nullptr)), c.logprobs);
      if (!choice.value("finish_reason", json(nullptr)).is_null()) {
        c.finish = finish_of(choice, c.ids);
        continue;  // sent with the usage
      }
      out += event(index, c, nullptr);
    }
    return out;
  }

 private:
  struct Choice {
    std::string text;
    json ids = json::array();
    size_t prompt_tokens = 0;
    json finish = nullptr;
    bool finish_sent = false;
    json logprobs = json::object();  // this chunk's output_token_logprobs / output_top_logprobs
  };

  std::string event(int index, const Choice& c, const json* usage) const {
    json meta = {{"id", request_.batch || request_.n > 1 ? id_ + "_" + std::to_string(index) : id_},
                 {"finish_reason", c.finish},
                 {"prompt_tokens", c.prompt_tokens},
                 {"completion_tokens", c.ids.size()}};
    if (usage && !request_.batch)
      meta["cached_tokens"] = usage->value("prompt_tokens_details", json::object()).value("cached_tokens", 0);
    if (request_.logprobs) meta.update(c.logprobs);
    json out = {{"text", c.text}, {"output_ids", c.ids}, {"meta_info", std::move(meta)}};
    if (request_.batch || request_.n > 1) out["index"] = index;
    return "data: " + dump(out) + "\n\n";
  }

  // The finished choices' last chunks, once.
  std::string flush(const json* usage) {
    std::string out;
    for (auto& [index, c] : choices_)
      if (!c.finish.is_null() && !c.finish_sent) {
        out += event(index, c, usage);
        c.finish_sent = true;
      }
    return out;
  }

  const GenerateRequest& request_;  // the responder's
  std::string id_;
  std::map<int, Choice> choices_;
};

class GenerateResponder : public adapter::ChatAdapterResponder {
 public:
  GenerateResponder(std::shared_ptr<Responder> inner, GenerateRequest request)
      : ChatAdapterResponder(std::move(inner)), request_(std::move(request)), stream_(request_) {}

 protected:
  void rewrite(HttpResponse& response) override {
    if (response.status == 200) response.body = generate_of_completion(response.body, request_);
  }
  std::string translate(const std::string& payload) override { return stream_.translate(payload); }

 private:
  GenerateRequest request_;
  GenerateStream stream_;
};

}  // namespace

std::shared_ptr<Responder> sglang_generate_responder(std::shared_ptr<Responder> inner, GenerateRequest request) {
  return std::make_shared<GenerateResponder>(std::move(inner), std::move(request));
}

}  // namespace glms::server

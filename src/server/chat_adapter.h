// What the APIs served over the chat completion pipeline share (Anthropic's Messages, OpenAI's
// Responses): reading their request JSON with 400s that name the field, and a Responder that
// rewrites the pipeline's answers, whole or streamed, into the other API's. Included by those
// adapters' .cpp files only (it brings nlohmann/json).
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"
#include "server/http_types.h"

namespace glms::server::adapter {

using nlohmann::json;

inline std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The request body as a JSON object, or a 400.
inline json parse_body(std::string_view body) {
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded()) bad_request("request body is not valid JSON");
  if (!doc.is_object()) bad_request("request body must be a JSON object");
  return doc;
}

// `at` is the path of the object holding the field, ending in '.' (or empty at the top level).
inline const json& required(const json& doc, const char* key, const std::string& at) {
  if (!doc.is_object() || !doc.contains(key)) bad_request(at + key + ": Field required", at + key);
  return doc[key];
}

// A string member of an object ("" when absent or null); another type is a 400 naming it.
inline std::string string_field(const json& object, const char* key, const std::string& at) {
  if (!object.contains(key) || object[key].is_null()) return "";
  if (!object[key].is_string()) bad_request(at + key + " must be a string", at + key);
  return object[key].get<std::string>();
}

// A boolean member (`fallback` when absent or null); another type is a 400 naming it.
inline bool bool_field(const json& object, const char* key, const std::string& at, bool fallback = false) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) bad_request(at + key + " must be a boolean", at + key);
  return object[key].get<bool>();
}

// The "text" string of a text part or block.
inline std::string text_of(const json& part, const std::string& at) {
  const json& text = required(part, "text", at);
  if (!text.is_string()) bad_request(at + "text must be a string", at + "text");
  return text.get<std::string>();
}

// What a text-only model reads of a part it cannot see (an image, a document, a file).
inline std::string placeholder_of(const std::string& type) {
  return "[" + type + " omitted: the model reads text only]";
}

inline void append_part(std::string& text, const std::string& part, const char* separator) {
  if (part.empty()) return;
  if (!text.empty()) text += separator;
  text += part;
}

// visit(item, its path ending in '.') for each item of an array of objects (`at` ends in '.').
template <typename Visit>
void for_each_object(const json& items, const std::string& at, Visit visit) {
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item_at = at + std::to_string(i) + ".";
    if (!items[i].is_object()) bad_request(item_at + " must be an object", at + std::to_string(i));
    visit(items[i], item_at);
  }
}

// The OpenAI error of a non-200 chat answer: its message ("" when the body has none).
inline std::string error_message_of(const std::string& body) {
  const json doc = json::parse(body, nullptr, false);
  return doc.is_object() && doc.contains("error") && doc["error"].is_object() ? doc["error"].value("message", "") : "";
}

// A Responder in front of `inner` that rewrites the chat pipeline's answers: a whole answer by
// rewrite(), a stream's OpenAI SSE payloads ("data: PAYLOAD\n\n", one or several a write; "[DONE]"
// last) by translate(), one at a time and in order, whose output is written as it is.
class ChatAdapterResponder : public ForwardingResponder {
 public:
  using ForwardingResponder::ForwardingResponder;

  void reply(HttpResponse response) override {
    rewrite(response);
    ForwardingResponder::reply(std::move(response));
  }
  void write(std::string data) override {
    std::string out;
    {
      std::lock_guard lock(mutex_);
      size_t at = 0;
      while (at < data.size()) {
        const size_t end = data.find("\n\n", at);
        const std::string event = data.substr(at, end == std::string::npos ? std::string::npos : end - at);
        at = end == std::string::npos ? data.size() : end + 2;
        if (event.rfind("data: ", 0) == 0) out += translate(event.substr(6));
      }
    }
    if (!out.empty()) ForwardingResponder::write(std::move(out));
  }

 protected:
  virtual void rewrite(HttpResponse& response) = 0;
  virtual std::string translate(const std::string& payload) = 0;

 private:
  std::mutex mutex_;
};

}  // namespace glms::server::adapter

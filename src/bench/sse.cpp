#include "bench/sse.h"

#include <cstdint>

#include <nlohmann/json.hpp>

namespace glms::bench {

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') {
        start = i + 1;
        continue;
      }
    }
    if (c != '\n' && c != '\r') continue;
    partial_.append(bytes.substr(start, i - start));
    line(partial_, events);
    partial_.clear();
    skip_lf_ = c == '\r';
    start = i + 1;
  }
  partial_.append(bytes.substr(start));
}

std::string SseParser::finish() {
  std::vector<std::string> events;
  if (!partial_.empty()) line(partial_, events);
  partial_.clear();
  std::string out = has_data_ ? data_ : std::string();
  data_.clear();
  has_data_ = false;
  return out;
}

void SseParser::line(std::string_view l, std::vector<std::string>& events) {
  if (l.empty()) {
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  if (field != "data") return;
  std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

namespace {

using nlohmann::json;

std::string string_at(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A count the server reported; a number that is not a count an int holds (negative, fractional,
// huge) counts as absent. Found by fuzz/fuzz_sse: converting 9.9e9 to int is undefined.
int int_at(const json& obj, const char* key, int fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) return fallback;
  const double v = it->get<double>();
  if (!(v >= 0 && v <= 2147483647.0) || v != static_cast<double>(static_cast<int64_t>(v))) return fallback;
  return static_cast<int>(v);
}

}  // namespace

StreamEvent interpret_event(std::string_view data) {
  StreamEvent ev;
  size_t b = 0, e = data.size();
  while (b < e && (data[b] == ' ' || data[b] == '\t')) ++b;
  while (e > b && (data[e - 1] == ' ' || data[e - 1] == '\t' || data[e - 1] == '\n')) --e;
  if (data.substr(b, e - b) == "[DONE]") {
    ev.done = true;
    return ev;
  }
  json doc = json::parse(data.begin(), data.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    ev.malformed = true;
    ev.error = "malformed stream event: " + std::string(data.substr(0, 200));
    return ev;
  }
  if (auto err = doc.find("error"); err != doc.end() && !err->is_null()) {
    ev.error = err->is_object() ? string_at(*err, "message") : err->dump();
    if (ev.error.empty()) ev.error = err->dump();
    return ev;
  }
  if (auto ch = doc.find("choices"); ch != doc.end() && ch->is_array() && !ch->empty() && (*ch)[0].is_object()) {
    const json& c = (*ch)[0];
    if (auto fr = c.find("finish_reason"); fr != c.end() && fr->is_string()) ev.finish_reason = fr->get<std::string>();
    if (auto t = c.find("text"); t != c.end() && t->is_string()) ev.text = t->get<std::string>();
    if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
      ev.text = string_at(*d, "content");
      std::string reasoning = string_at(*d, "reasoning_content");
      if (reasoning.empty()) reasoning = string_at(*d, "reasoning");
      ev.text += reasoning;
      if (auto tc = d->find("tool_calls"); tc != d->end() && tc->is_array() && !tc->empty()) {
        ev.token = true;
        for (const json& call : *tc)
          if (auto f = call.find("function"); f != call.end() && f->is_object()) ev.text += string_at(*f, "arguments");
      }
    }
    if (!ev.text.empty()) ev.token = true;
  }
  if (auto u = doc.find("usage"); u != doc.end() && u->is_object()) {
    ev.has_usage = true;
    ev.prompt_tokens = int_at(*u, "prompt_tokens", 0);
    ev.completion_tokens = int_at(*u, "completion_tokens", 0);
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
      ev.cached_tokens = int_at(*d, "cached_tokens", -1);
  }
  return ev;
}

}  // namespace glms::bench

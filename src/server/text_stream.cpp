#include "server/text_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

namespace glms::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop) : include_stop_(include_stop) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));  // an empty string would match everywhere
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

StopMatcher::Result StopMatcher::push(std::string_view piece, bool search) {
  Result result;
  if (matched_) return result;
  if (stops_.empty()) {
    result.released.assign(piece);
    return result;
  }
  // Everything before `old_size` was searched or must not match on its own: stop s is looked for
  // from its last s.size() - 1 bytes on, so that it ends inside the new piece.
  const size_t old_size = pending_.size();
  pending_.append(piece);
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = search ? pending_.find(s, old_size >= s.size() ? old_size - (s.size() - 1) : 0) : std::string::npos;
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_stop->size()))) {
      best = at;
      best_stop = &s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    result.matched = true;
    result.stop = *best_stop;
    result.released = pending_.substr(0, include_stop_ ? best + best_stop->size() : best);
    pending_.clear();
    return result;
  }
  size_t keep = std::min(pending_.size(), longest_ - 1);
  size_t cut = pending_.size() - keep;
  // Never split a UTF-8 character: move the cut back to a lead byte.
  while (cut > 0 && cut < pending_.size() && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  result.released = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return result;
}

std::string StopMatcher::finish() {
  std::string out;
  out.swap(pending_);
  return matched_ ? std::string() : out;
}

namespace {
class PlainParser final : public OutputParser {
 public:
  ParsedDelta feed(std::string_view text) override {
    ParsedDelta d;
    d.content.assign(text);
    return d;
  }
  ParsedDelta finish() override { return {}; }
};
}  // namespace

std::unique_ptr<OutputParser> make_plain_parser() { return std::make_unique<PlainParser>(); }

std::string random_id(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                                   (counter.fetch_add(1) << 32));
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 2; ++i) {
    uint64_t x = rng();
    for (int k = 0; k < 16; ++k) {
      id += hex[x & 15];
      x >>= 4;
    }
  }
  return id;
}

}  // namespace glms::server

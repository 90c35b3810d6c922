// The Responses API's stored responses (serve --responses-store N, or vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE=1): the newest N responses in memory, each with the conversation
// that led to it and its answer, for previous_response_id, GET and DELETE /v1/responses/{id}.
// Thread-safe; the oldest response goes first when N are kept.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace glms::server {

class ResponsesStore {
 public:
  struct Entry {
    std::string response;      // the Response object (JSON)
    std::string conversation;  // the chat messages of its input and answer, instructions left out (JSON array)
  };

  explicit ResponsesStore(size_t capacity) : capacity_(capacity) {}

  void put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // ids, oldest first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
};

}  // namespace glms::server

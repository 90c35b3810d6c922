#include "server/responses_store.h"

namespace glms::server {

void ResponsesStore::put(const std::string& id, Entry entry) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    order_.erase(it->second.second);
    entries_.erase(it);
  }
  while (entries_.size() >= capacity_) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id);
  entries_.emplace(id, std::make_pair(std::move(entry), std::prev(order_.end())));
}

std::optional<ResponsesStore::Entry> ResponsesStore::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.first;
}

bool ResponsesStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  order_.erase(it->second.second);
  entries_.erase(it);
  return true;
}

size_t ResponsesStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace glms::server

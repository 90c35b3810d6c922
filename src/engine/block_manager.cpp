#include "engine/block_manager.h"

#include <span>

namespace glms::engine {

BlockManager::BlockManager(int num_blocks, int block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching), pool_(num_blocks), prefix_cache_(pool_, block_size) {}

bool BlockManager::ensure(Sequence& seq, int num_tokens) {
  const int needed = (num_tokens + block_size_ - 1) / block_size_;
  while (static_cast<int>(seq.block_table.size()) < needed) {
    std::optional<int> block = pool_.allocate();
    if (!block && prefix_cache_.evict(needed - static_cast<int>(seq.block_table.size())) > 0) block = pool_.allocate();
    if (!block) return false;
    seq.block_table.push_back(*block);
  }
  return true;
}

void BlockManager::release(Sequence& seq) {
  for (int32_t block : seq.block_table) pool_.release(block);
  seq.block_table.clear();
  seq.num_computed = 0;
  seq.cached_blocks = 0;
  seq.mtp_next = 0;
  seq.mtp_hidden.clear();
}

void BlockManager::take_cached_prefix(Sequence& seq) {
  if (!prefix_caching_ || !seq.block_table.empty()) return;
  seq.block_table = prefix_cache_.match(seq.tokens, seq.params.cache_salt);
  seq.num_computed = static_cast<int>(seq.block_table.size()) * block_size_;
  seq.mtp_next = seq.num_computed;  // the cached blocks' draft rows are the writer's
  seq.cached_blocks = static_cast<int>(seq.block_table.size());
}

int BlockManager::cached_tokens(const std::vector<int32_t>& tokens, const std::string& salt) const {
  return prefix_caching_ ? prefix_cache_.peek(tokens, salt) * block_size_ : 0;
}

void BlockManager::cache_full_blocks(Sequence& seq) {
  if (!prefix_caching_) return;
  const int full = seq.num_computed / block_size_;
  if (full <= seq.cached_blocks) return;  // no block filled since the last insert
  seq.cached_blocks = full;
  prefix_cache_.insert(std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(full) * block_size_),
                       std::span<const int32_t>(seq.block_table.data(), full), seq.params.cache_salt);
}

void BlockManager::record_lookup(int64_t queried, int64_t hit) {
  if (prefix_caching_) prefix_cache_.record_lookup(queried, hit);
}

int BlockManager::num_free() const { return pool_.num_free() + prefix_cache_.num_evictable_blocks(); }

}  // namespace glms::engine

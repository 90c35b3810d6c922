// One data-parallel rank's cache blocks: the pool of its paged cache and the radix prefix cache
// over it. Sequences take blocks as they grow, share cached prefixes on admission, and give
// everything back when they finish or are preempted.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "engine/sequence.h"
#include "kv/prefix_cache.h"

namespace glms::engine {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool prefix_caching);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int block_size() const { return block_size_; }
  // Gives `seq` blocks for its first `num_tokens` tokens, evicting unused cached prefixes when
  // none is free; false when even that is not enough (the caller preempts or waits).
  bool ensure(Sequence& seq, int num_tokens);
  // Returns the sequence's blocks (it is to be recomputed from its tokens, or is done).
  void release(Sequence& seq);
  // A sequence holding no blocks starts from the cached blocks its tokens begin with.
  void take_cached_prefix(Sequence& seq);
  // Cached prompt tokens `tokens` would find here now (to choose a rank), without holding them.
  int cached_tokens(const std::vector<int32_t>& tokens, const std::string& salt) const;
  // Records the sequence's computed full blocks in the prefix cache.
  void cache_full_blocks(Sequence& seq);
  // Prefix-cache statistics: a request's lookup, once.
  void record_lookup(int64_t queried, int64_t hit);
  // Frees every cached block no sequence holds; returns how many.
  int drop_cached_prefixes() { return prefix_cache_.evict(std::numeric_limits<int>::max()); }

  int num_blocks() const { return pool_.num_blocks(); }
  int num_free() const;          // free, or holding only evictable cached prefixes
  int num_cached() const { return prefix_cache_.num_cached_blocks(); }
  int64_t query_tokens() const { return prefix_cache_.query_tokens(); }
  int64_t hit_tokens() const { return prefix_cache_.hit_tokens(); }

 private:
  int block_size_;
  bool prefix_caching_;
  kv::BlockPool pool_;
  kv::PrefixCache prefix_cache_;
};

}  // namespace glms::engine

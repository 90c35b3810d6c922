// A radix tree over full cache blocks: each node is one block of `block_size` token ids whose
// latent rows are computed, under the node of the block before it. Requests that start with
// the same tokens share those blocks instead of recomputing them. The tree holds one reference
// on each of its blocks (BlockPool counts); blocks that only the tree holds are evicted least
// recently used first, leaves before their parents. Only computed (verified) tokens enter.
// A salt (vLLM's request cache_salt) parts the tree: a prefix is shared only by requests with the
// same salt, so tenants cannot learn from each other's cache hits; no salt is one more such part.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/latent_cache.h"

namespace glms::kv {

class PrefixCache {
 public:
  PrefixCache(BlockPool& pool, int block_size);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest run of cached full blocks that `tokens` starts with, never covering the last
  // token (its logits must be computed). Each returned block is retained for the caller, who
  // releases it through the pool when done.
  std::vector<int32_t> match(std::span<const int32_t> tokens, const std::string& salt = "");
  // How many blocks match() would return now, without retaining or touching them (to choose
  // where a request runs).
  int peek(std::span<const int32_t> tokens, const std::string& salt = "") const;
  // Statistics, in tokens: a request looked up `queried` prompt tokens and found `hit` cached.
  // Callers record each request once (a request retried while waiting is not a new query).
  void record_lookup(int64_t queried, int64_t hit) {
    query_tokens_ += queried;
    hit_tokens_ += hit;
  }

  // Records the full blocks of `tokens` (computed rows in `blocks`, one per block of tokens)
  // from the root; blocks already cached under the same tokens are only touched. New nodes
  // retain their block.
  void insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks, const std::string& salt = "");

  // Frees up to `count` blocks that only the cache holds, least recently used leaves first.
  // Returns how many were freed.
  int evict(int count);

  int num_cached_blocks() const { return num_nodes_; }
  // Blocks evict() could free now: nodes whose whole subtree only the cache holds.
  int num_evictable_blocks() const;
  int64_t query_tokens() const { return query_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }

 private:
  struct Node;
  // The child of `parent` holding `block_tokens`; under the root, also `salt`.
  Node* child(Node* parent, std::span<const int32_t> block_tokens, const std::string& salt) const;
  uint64_t key_of(const Node* parent, std::span<const int32_t> block_tokens, const std::string& salt) const;
  void touch(Node* node);  // marks the node used now, keeping `leaves_` ordered

  BlockPool& pool_;
  int block_size_;
  std::unique_ptr<Node> root_;
  // Childless nodes by (last use, node): eviction candidates, least recently used first, so
  // that freeing a block costs a walk over the few leaves still in use, not the whole tree.
  std::set<std::pair<uint64_t, Node*>> leaves_;
  int num_nodes_ = 0;
  uint64_t clock_ = 0;
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace glms::kv

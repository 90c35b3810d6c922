#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include "core/error.h"

namespace glms::kv {

struct PrefixCache::Node {
  Node* parent = nullptr;
  uint64_t key = 0;                 // hash of this block's tokens
  std::vector<int32_t> tokens;      // [block_size] the block's token ids (compared exactly)
  int32_t block = -1;               // physical block holding the computed rows
  uint64_t last_used = 0;
  std::unordered_multimap<uint64_t, std::unique_ptr<Node>> children;
};

namespace {
uint64_t block_key(std::span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size_bytes());
}
}  // namespace

PrefixCache::PrefixCache(BlockPool& pool, int block_size)
    : pool_(pool), block_size_(block_size), root_(std::make_unique<Node>()) {}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::child(Node* parent, std::span<const int32_t> block_tokens) const {
  auto [first, last] = parent->children.equal_range(block_key(block_tokens));
  for (auto it = first; it != last; ++it)
    if (std::equal(block_tokens.begin(), block_tokens.end(), it->second->tokens.begin())) return it->second.get();
  return nullptr;
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens) {
  std::vector<int32_t> blocks;
  if (tokens.empty()) return blocks;
  const size_t usable = (tokens.size() - 1) / block_size_;  // keep the last token to compute
  ++clock_;
  Node* node = root_.get();
  for (size_t b = 0; b < usable; ++b) {
    node = child(node, tokens.subspan(b * block_size_, block_size_));
    if (!node) break;
    node->last_used = clock_;
    pool_.retain(node->block);
    blocks.push_back(node->block);
  }
  return blocks;
}

void PrefixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  const size_t full = std::min(tokens.size() / block_size_, blocks.size());
  ++clock_;
  Node* node = root_.get();
  for (size_t b = 0; b < full; ++b) {
    const auto block_tokens = tokens.subspan(b * block_size_, block_size_);
    Node* next = child(node, block_tokens);
    if (!next) {
      auto created = std::make_unique<Node>();
      created->parent = node;
      created->key = block_key(block_tokens);
      created->tokens.assign(block_tokens.begin(), block_tokens.end());
      created->block = blocks[b];
      pool_.retain(blocks[b]);
      next = created.get();
      node->children.emplace(created->key, std::move(created));
      ++num_nodes_;
    }
    next->last_used = clock_;
    node = next;
  }
}

int PrefixCache::num_evictable_blocks() const {
  // Post-order: a node counts when it and every node below it are held by the cache alone
  // (a parent whose child is in use cannot be evicted, since eviction goes leaves first).
  int count = 0;
  struct Frame {
    const Node* node;
    bool children_done;
  };
  std::vector<Frame> stack = {{root_.get(), false}};
  std::unordered_map<const Node*, bool> evictable;  // whole subtree unreferenced
  while (!stack.empty()) {
    Frame frame = stack.back();
    stack.pop_back();
    if (!frame.children_done) {
      stack.push_back({frame.node, true});
      for (const auto& [key, next] : frame.node->children) stack.push_back({next.get(), false});
      continue;
    }
    bool all = frame.node == root_.get() || pool_.ref_count(frame.node->block) == 1;
    for (const auto& [key, next] : frame.node->children) all = all && evictable[next.get()];
    evictable[frame.node] = all;
    if (all && frame.node != root_.get()) ++count;
  }
  return count;
}

int PrefixCache::evict(int count) {
  int freed = 0;
  while (freed < count) {
    // Least recently used leaf that only the tree holds.
    std::multimap<uint64_t, Node*> leaves;
    std::vector<Node*> stack = {root_.get()};
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (auto& [key, next] : node->children) {
        if (next->children.empty()) {
          if (pool_.ref_count(next->block) == 1) leaves.emplace(next->last_used, next.get());
        } else {
          stack.push_back(next.get());
        }
      }
    }
    if (leaves.empty()) break;
    for (auto& [time, leaf] : leaves) {
      if (freed >= count) break;
      Node* parent = leaf->parent;
      pool_.release(leaf->block);
      auto [first, last] = parent->children.equal_range(leaf->key);
      for (auto it = first; it != last; ++it)
        if (it->second.get() == leaf) {
          parent->children.erase(it);
          break;
        }
      --num_nodes_;
      ++freed;
    }
  }
  return freed;
}

}  // namespace glms::kv

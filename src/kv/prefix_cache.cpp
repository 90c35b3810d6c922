#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace glms::kv {

struct PrefixCache::Node {
  Node* parent = nullptr;
  uint64_t key = 0;                 // hash of this block's tokens (and, under the root, the salt)
  std::vector<int32_t> tokens;      // [block_size] the block's token ids (compared exactly)
  std::string salt;                 // under the root: the requests' salt (compared exactly)
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

uint64_t PrefixCache::key_of(const Node* parent, std::span<const int32_t> block_tokens, const std::string& salt) const {
  const uint64_t key = block_key(block_tokens);
  return parent == root_.get() && !salt.empty() ? key ^ XXH3_64bits(salt.data(), salt.size()) : key;
}

PrefixCache::Node* PrefixCache::child(Node* parent, std::span<const int32_t> block_tokens,
                                      const std::string& salt) const {
  auto [first, last] = parent->children.equal_range(key_of(parent, block_tokens, salt));
  for (auto it = first; it != last; ++it)
    if (std::equal(block_tokens.begin(), block_tokens.end(), it->second->tokens.begin()) &&
        (parent != root_.get() || it->second->salt == salt))
      return it->second.get();
  return nullptr;
}

void PrefixCache::touch(Node* node) {
  if (node->children.empty()) {
    leaves_.erase({node->last_used, node});
    node->last_used = clock_;
    leaves_.insert({node->last_used, node});
  } else {
    node->last_used = clock_;
  }
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, const std::string& salt) {
  std::vector<int32_t> blocks;
  if (tokens.empty()) return blocks;
  const size_t usable = (tokens.size() - 1) / block_size_;  // keep the last token to compute
  ++clock_;
  Node* node = root_.get();
  for (size_t b = 0; b < usable; ++b) {
    node = child(node, tokens.subspan(b * block_size_, block_size_), salt);
    if (!node) break;
    touch(node);
    pool_.retain(node->block);
    blocks.push_back(node->block);
  }
  return blocks;
}

int PrefixCache::peek(std::span<const int32_t> tokens, const std::string& salt) const {
  if (tokens.empty()) return 0;
  const size_t usable = (tokens.size() - 1) / block_size_;
  Node* node = root_.get();
  int found = 0;
  for (size_t b = 0; b < usable; ++b) {
    node = child(node, tokens.subspan(b * block_size_, block_size_), salt);
    if (!node) break;
    ++found;
  }
  return found;
}

void PrefixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks, const std::string& salt) {
  const size_t full = std::min(tokens.size() / block_size_, blocks.size());
  ++clock_;
  Node* node = root_.get();
  for (size_t b = 0; b < full; ++b) {
    const auto block_tokens = tokens.subspan(b * block_size_, block_size_);
    Node* next = child(node, block_tokens, salt);
    if (!next) {
      auto created = std::make_unique<Node>();
      created->parent = node;
      created->key = key_of(node, block_tokens, salt);
      created->tokens.assign(block_tokens.begin(), block_tokens.end());
      if (node == root_.get()) created->salt = salt;
      created->block = blocks[b];
      created->last_used = clock_;
      pool_.retain(blocks[b]);
      next = created.get();
      if (node != root_.get() && node->children.empty()) leaves_.erase({node->last_used, node});
      node->children.emplace(created->key, std::move(created));
      leaves_.insert({next->last_used, next});
      ++num_nodes_;
    }
    touch(next);
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
  bool progress = true;
  while (freed < count && progress) {
    // One pass over the leaves, oldest first; a parent left childless joins the leaves and is
    // reached by the next pass.
    progress = false;
    for (auto it = leaves_.begin(); it != leaves_.end() && freed < count;) {
      Node* leaf = it->second;
      if (pool_.ref_count(leaf->block) != 1) {  // a running request still reads it
        ++it;
        continue;
      }
      it = leaves_.erase(it);
      Node* parent = leaf->parent;
      pool_.release(leaf->block);
      auto [first, last] = parent->children.equal_range(leaf->key);
      for (auto child_it = first; child_it != last; ++child_it)
        if (child_it->second.get() == leaf) {
          parent->children.erase(child_it);
          break;
        }
      if (parent != root_.get() && parent->children.empty()) leaves_.insert({parent->last_used, parent});
      --num_nodes_;
      ++freed;
      progress = true;
    }
  }
  return freed;
}

}  // namespace glms::kv

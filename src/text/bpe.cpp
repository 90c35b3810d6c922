#include "text/bpe.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace glms::text {
namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct MergeResult {
  int32_t rank = -1;
  int32_t new_id = -1;
};

// Open-addressing map from a token-id pair to its merge.
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, MergeResult>>& entries) {
    size_t capacity = 16;
    while (capacity < entries.size() * 2) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, {});
    mask_ = capacity - 1;
    for (const auto& [key, value] : entries) {
      size_t slot = hash(key) & mask_;
      while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
      keys_[slot] = key;
      values_[slot] = value;  // a repeated pair keeps its last rank, as HF does
    }
  }
  MergeResult find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
      if (keys_[slot] == key) return values_[slot];
      if (keys_[slot] == kEmpty) return {};
    }
  }
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17); }
  std::vector<uint64_t> keys_;
  std::vector<MergeResult> values_;
  size_t mask_ = 0;
};

// Word -> ids cache, sharded so that concurrent encoders rarely wait on each other.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kMaxEntriesPerShard = 16384;

  bool lookup(std::string_view word, std::vector<int32_t>& out) {
    Shard& shard = shard_for(word);
    std::lock_guard lock(shard.mutex);
    auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view word, const int32_t* ids, size_t count) {
    Shard& shard = shard_for(word);
    std::lock_guard lock(shard.mutex);
    if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
    shard.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + count));
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  // A cheap spread over shards; the map hashes the whole word once inside its shard.
  Shard& shard_for(std::string_view word) {
    const size_t mix = word.size() * 131 + static_cast<unsigned char>(word.front()) * 7 + static_cast<unsigned char>(word.back());
    return shards_[mix % shards_.size()];
  }
  std::array<Shard, 16> shards_;
};

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t left_id;
  int32_t right_id;
  int32_t new_id;
  // Min-heap order: lowest rank first, then leftmost.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

size_t char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

}  // namespace

struct BpeModel::Impl {
  TokenMap vocab;
  MergeTable merges;
  std::vector<int32_t> small_char_ids;  // id of the single-character token for code points < 2048
  mutable WordCache cache;
};

BpeModel::BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
                   std::vector<std::pair<std::string, std::string>> merges, BpeOptions options)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)) {
  int32_t max_id = -1;
  impl_->vocab.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    if (id < 0) throw Error("BPE vocab: token '" + token + "' has negative id " + std::to_string(id));
    max_id = std::max(max_id, id);
    impl_->vocab[token] = id;
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_used_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : impl_->vocab) {
    id_to_token_[static_cast<size_t>(id)] = token;
    id_used_[static_cast<size_t>(id)] = true;
  }

  const std::string& prefix = options_.continuing_subword_prefix;
  std::vector<std::pair<uint64_t, MergeResult>> entries;
  entries.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t left_id = token_to_id(left);
    const int32_t right_id = token_to_id(right);
    std::string merged = left;
    merged.append(!prefix.empty() && right.starts_with(prefix) ? right.substr(prefix.size()) : right);
    const int32_t new_id = token_to_id(merged);
    if (left_id < 0 || right_id < 0 || new_id < 0) {
      throw Error("BPE merge " + std::to_string(rank) + " ('" + left + "' '" + right + "') uses token '" +
                  (left_id < 0 ? left : right_id < 0 ? right : merged) + "' that is not in the vocab");
    }
    entries.push_back({MergeTable::pair_key(left_id, right_id), {static_cast<int32_t>(rank), new_id}});
  }
  impl_->merges.build(entries);

  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    if (unk_id_ < 0) throw Error("BPE unk_token '" + *options_.unk_token + "' is not in the vocab");
  }
  if (prefix.empty() && options_.end_of_word_suffix.empty()) {
    impl_->small_char_ids.assign(2048, -1);
    for (char32_t cp = 0; cp < 2048; ++cp) {
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      impl_->small_char_ids[cp] = token_to_id(s);
    }
  }
}

BpeModel::~BpeModel() = default;

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_used_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

int32_t BpeModel::char_id(std::string_view ch, bool first, bool last) const {
  if (!impl_->small_char_ids.empty()) {
    const auto b0 = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1) return impl_->small_char_ids[b0];
    if (ch.size() == 2) {
      const char32_t cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | (static_cast<unsigned char>(ch[1]) & 0x3F);
      return impl_->small_char_ids[cp];
    }
    return token_to_id(ch);
  }
  std::string decorated;
  if (!first) decorated = options_.continuing_subword_prefix;
  decorated.append(ch);
  if (last) decorated.append(options_.end_of_word_suffix);
  return token_to_id(decorated);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const int32_t id = token_to_id(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  if (cacheable && impl_->cache.lookup(word, out)) return;
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) impl_->cache.insert(word, out.data() + start, out.size() - start);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();

  bool previous_unk = false;
  auto push_symbol = [&](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1});
    if (index > 0) symbols[static_cast<size_t>(index - 1)].next = index;
  };
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = std::min(char_length(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const std::string_view ch = word.substr(pos, len);
    const bool first = pos == 0;
    pos += len;
    const int32_t id = char_id(ch, first, pos == word.size());
    if (id >= 0) {
      push_symbol(id);
      previous_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      std::array<int32_t, 4> byte_ids{};
      bool all_found = true;
      for (size_t k = 0; k < ch.size(); ++k) {
        static constexpr char kHex[] = "0123456789ABCDEF";
        const auto b = static_cast<unsigned char>(ch[k]);
        const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
        byte_ids[k] = token_to_id(std::string_view(name, sizeof(name)));
        all_found = all_found && byte_ids[k] >= 0;
      }
      if (all_found) {
        for (size_t k = 0; k < ch.size(); ++k) push_symbol(byte_ids[k]);
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0 && !(options_.fuse_unk && previous_unk)) push_symbol(unk_id_);
    previous_unk = unk_id_ >= 0;
  }

  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const Symbol& left = symbols[static_cast<size_t>(pos)];
    if (left.next < 0) return;
    const int32_t right_id = symbols[static_cast<size_t>(left.next)].id;
    const MergeResult merge = impl_->merges.find(left.id, right_id);
    if (merge.rank < 0) return;
    heap.push_back({merge.rank, pos, left.id, right_id, merge.new_id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[static_cast<size_t>(c.pos)];
    // Stale when either side was merged away or changed since the candidate was queued.
    if (left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (right.id != c.right_id) continue;
    left.id = c.new_id;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.pos;
    right.id = -1;  // removed
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    out.push_back(symbols[static_cast<size_t>(i)].id);
  }
}

}  // namespace glms::text

// Block pool reference counts and the radix prefix cache: matching, sharing, LRU eviction; the
// cache dtype names.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "kv/latent_cache.h"
#include "kv/prefix_cache.h"

using namespace glms;

namespace {
std::vector<int32_t> range_tokens(int count, int first = 100) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}
}  // namespace

TEST(BlockPool, CountsReferencesAndRefusesDoubleRelease) {
  kv::BlockPool pool(3);
  const int a = *pool.allocate(), b = *pool.allocate(), c = *pool.allocate();
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  pool.retain(a);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 0);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_THROW(pool.release(a), Error);
  EXPECT_THROW(pool.retain(a), Error);
}

TEST(PrefixCache, MatchesFullBlocksButNeverTheLastToken) {
  kv::BlockPool pool(16);
  kv::PrefixCache cache(pool, 4);
  const auto tokens = range_tokens(12);  // three full blocks
  std::vector<int32_t> blocks = {*pool.allocate(), *pool.allocate(), *pool.allocate()};
  cache.insert(tokens, blocks);
  EXPECT_EQ(cache.num_cached_blocks(), 3);
  // The same 12 tokens: only two blocks, so that the last token is computed; peek counts them
  // without holding them.
  EXPECT_EQ(cache.peek(tokens), 2);
  EXPECT_EQ(cache.peek(range_tokens(14)), 3);
  EXPECT_EQ(cache.peek(range_tokens(14, 500)), 0);
  EXPECT_EQ(pool.ref_count(blocks[0]), 2);  // the writer's and the cache's
  auto hit = cache.match(tokens);
  EXPECT_EQ(hit, std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));
  for (int32_t block : hit) pool.release(block);
  // A longer prompt sharing the prefix gets all three; a different first block gets none.
  auto longer = range_tokens(14);
  hit = cache.match(longer);
  EXPECT_EQ(hit, blocks);
  for (int32_t block : hit) pool.release(block);
  auto other = range_tokens(14, 500);
  EXPECT_TRUE(cache.match(other).empty());
}

// vLLM's cache_salt: the same tokens cached under one salt serve only requests with that salt;
// the unsalted part is one more such part, and salted blocks are evicted as any others.
TEST(PrefixCache, ASaltPartsTheCache) {
  kv::BlockPool pool(16);
  kv::PrefixCache cache(pool, 4);
  const auto tokens = range_tokens(9);  // two full blocks and one more token
  std::vector<int32_t> salted = {*pool.allocate(), *pool.allocate()};
  cache.insert(tokens, salted, "tenant-a");
  EXPECT_EQ(cache.peek(tokens, "tenant-a"), 2);
  EXPECT_EQ(cache.peek(tokens, "tenant-b"), 0);
  EXPECT_EQ(cache.peek(tokens), 0);
  EXPECT_TRUE(cache.match(tokens, "tenant-b").empty());
  EXPECT_TRUE(cache.match(tokens).empty());
  auto hit = cache.match(tokens, "tenant-a");
  EXPECT_EQ(hit, salted);
  for (int32_t block : hit) pool.release(block);
  // The same tokens without a salt are cached apart, and the salted part still answers.
  std::vector<int32_t> plain = {*pool.allocate(), *pool.allocate()};
  cache.insert(tokens, plain);
  EXPECT_EQ(cache.num_cached_blocks(), 4);
  hit = cache.match(tokens);
  EXPECT_EQ(hit, plain);
  for (int32_t block : hit) pool.release(block);
  EXPECT_EQ(cache.peek(tokens, "tenant-a"), 2);
  // Once no request holds them, all four are evictable.
  for (int32_t block : salted) pool.release(block);
  for (int32_t block : plain) pool.release(block);
  EXPECT_EQ(cache.num_evictable_blocks(), 4);
  EXPECT_EQ(cache.evict(4), 4);
  EXPECT_EQ(cache.peek(tokens, "tenant-a"), 0);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesOnlyWhenUnreferenced) {
  kv::BlockPool pool(6);
  kv::PrefixCache cache(pool, 2);
  const auto first = range_tokens(4, 0), second = range_tokens(4, 50);
  std::vector<int32_t> first_blocks = {*pool.allocate(), *pool.allocate()};
  std::vector<int32_t> second_blocks = {*pool.allocate(), *pool.allocate()};
  cache.insert(first, first_blocks);
  cache.insert(second, second_blocks);
  // The sequences still hold their blocks: nothing is evictable.
  EXPECT_EQ(cache.num_evictable_blocks(), 0);
  EXPECT_EQ(cache.evict(4), 0);
  for (int32_t block : first_blocks) pool.release(block);
  for (int32_t block : second_blocks) pool.release(block);
  EXPECT_EQ(cache.num_evictable_blocks(), 4);
  // Touch the first chain, so the second is least recently used and goes first, leaf first.
  for (int32_t block : cache.match(range_tokens(5, 0))) pool.release(block);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.ref_count(second_blocks[1]), 0);
  EXPECT_EQ(pool.ref_count(second_blocks[0]), 1);
  EXPECT_EQ(cache.evict(10), 3);
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(cache.num_cached_blocks(), 0);
}

TEST(PrefixCache, AParentWithAHeldChildIsNotEvictable) {
  kv::BlockPool pool(4);
  kv::PrefixCache cache(pool, 2);
  const auto tokens = range_tokens(4);
  std::vector<int32_t> blocks = {*pool.allocate(), *pool.allocate()};
  cache.insert(tokens, blocks);
  pool.release(blocks[0]);  // the sequence keeps only its second block
  EXPECT_EQ(cache.num_evictable_blocks(), 0);
  EXPECT_EQ(cache.evict(2), 0);
  pool.release(blocks[1]);
  EXPECT_EQ(cache.num_evictable_blocks(), 2);
}

TEST(PrefixCache, StatisticsAreRecordedByTheCaller) {
  kv::BlockPool pool(2);
  kv::PrefixCache cache(pool, 2);
  cache.record_lookup(10, 4);
  cache.record_lookup(6, 0);
  EXPECT_EQ(cache.query_tokens(), 16);
  EXPECT_EQ(cache.hit_tokens(), 4);
}

// vLLM's --kv-cache-dtype spellings for what glmserve has; the rest are refused by name.
TEST(CacheDtype, ParsesVllmsNamesAndRefusesTheRest) {
  EXPECT_EQ(kv::parse_cache_dtype("auto"), kv::CacheDtype::kAuto);
  for (const char* fp8 : {"fp8", "fp8_e4m3", "fp8_ds_mla"}) EXPECT_EQ(kv::parse_cache_dtype(fp8), kv::CacheDtype::kFp8E4m3);
  for (const char* other : {"fp8_e5m2", "bfloat16", "FP8", ""}) {
    try {
      kv::parse_cache_dtype(other);
      ADD_FAILURE() << "accepted '" << other << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fp8_e4m3"), std::string::npos) << e.what();
    }
  }
  EXPECT_STREQ(kv::cache_dtype_name(kv::CacheDtype::kFp8E4m3), "fp8_e4m3");
}

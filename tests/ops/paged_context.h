// What the CUDA attention and indexer tests share (test_cuda_attention.cpp,
// test_cuda_indexer.cpp): sequences in a shuffled paged cache and the query tokens over them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace glms::testing {

// Sequences with the given context lengths in a shuffled paged cache (block_tables: [S,
// max_blocks]); slot() is a position's cache slot.
struct PagedContext {
  int block_size = 16, max_blocks = 0, num_blocks = 0;
  std::vector<int32_t> block_tables;  // [S, max_blocks]
  int64_t slot(int seq, int position) const {
    return int64_t{block_tables[seq * max_blocks + position / block_size]} * block_size + position % block_size;
  }
  PagedContext(const std::vector<int>& contexts, uint64_t seed) {
    for (int c : contexts) max_blocks = std::max(max_blocks, (c + block_size - 1) / block_size);
    num_blocks = max_blocks * static_cast<int>(contexts.size());
    std::vector<int32_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    block_tables = order;
  }
};

// A query token: its sequence and its position there.
struct Token {
  int seq, position;
};

}  // namespace glms::testing

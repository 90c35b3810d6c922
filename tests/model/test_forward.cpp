// The CPU forward against itself: the paged cache, chunking, batching and sparse selection
// must not change what the model computes. (Agreement with transformers is in tests/golden.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "model/glm5.h"
#include "model/layers.h"
#include "random_model.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_tokens;
using glms::testing::relative_l2;
using glms::testing::RandomModelSpec;
using glms::testing::TempDir;

namespace {

struct Fixture {
  TempDir dir{"forward"};
  model::Glm5Model model;
  explicit Fixture(const RandomModelSpec& spec)
      : model(model::load_weights(glms::testing::write_random_model(dir.path / "m", spec).string())) {}

  std::vector<int32_t> blocks(int count, uint64_t shuffle_seed = 0) const {
    std::vector<int32_t> table(count);
    std::iota(table.begin(), table.end(), 0);
    if (shuffle_seed) std::shuffle(table.begin(), table.end(), std::mt19937(shuffle_seed));
    return table;
  }

  // Logits of every prompt position from one prefill.
  std::vector<float> full_logits(const std::vector<int32_t>& tokens, int block_size = 8) const {
    const int num_blocks = (static_cast<int>(tokens.size()) + block_size - 1) / block_size;
    kv::PagedLatentCache cache(model.cache_layout(block_size), num_blocks);
    model::ForwardBatch batch;
    batch.add_sequence(tokens, 0, blocks(num_blocks), block_size, true);
    return model.forward(batch, cache);
  }
};

}  // namespace

TEST(Forward, LoadsEveryLayerKindAndTheMtpLayer) {
  Fixture f(RandomModelSpec{});
  const auto& w = f.model.weights();
  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_FALSE(w.layers[0].is_moe);
  EXPECT_TRUE(w.layers[1].is_moe);
  EXPECT_TRUE(w.layers[0].attention.has_indexer);
  EXPECT_FALSE(w.layers[1].attention.has_indexer);
  ASSERT_EQ(w.mtp.size(), 1u);
  EXPECT_EQ(w.mtp[0].eh_proj.cols, 2 * 40);
  EXPECT_GT(w.parameters, 0);
}

TEST(Forward, IncrementalDecodeEqualsFullRecompute) {
  Fixture f(RandomModelSpec{});
  const auto tokens = random_tokens(30, 97, 7);
  const auto reference = f.full_logits(tokens);  // [30, vocab]
  const int vocab = 97, block_size = 4, prefix = 5;
  kv::PagedLatentCache cache(f.model.cache_layout(block_size), 8);
  const auto table = f.blocks(8, 99);
  model::ForwardBatch prefill;
  prefill.add_sequence(std::vector<int32_t>(tokens.begin(), tokens.begin() + prefix), 0, table, block_size, false);
  auto logits = f.model.forward(prefill, cache);
  EXPECT_LT(relative_l2(logits.data(), reference.data() + (prefix - 1) * vocab, vocab), 1e-5);
  for (int pos = prefix; pos < 30; ++pos) {
    model::ForwardBatch step;
    step.add_sequence({tokens[pos]}, pos, table, block_size, false);
    logits = f.model.forward(step, cache);
    EXPECT_LT(relative_l2(logits.data(), reference.data() + pos * vocab, vocab), 1e-5) << "position " << pos;
  }
}

TEST(Forward, ChunkedPrefillEqualsOneShot) {
  Fixture f(RandomModelSpec{});
  const auto tokens = random_tokens(26, 97, 3);
  const auto reference = f.full_logits(tokens);
  const int block_size = 8;
  kv::PagedLatentCache cache(f.model.cache_layout(block_size), 4);
  const auto table = f.blocks(4, 5);
  std::vector<float> all;
  for (int start = 0; start < 26; start += 7) {
    const int end = std::min(26, start + 7);
    model::ForwardBatch chunk;
    chunk.add_sequence(std::vector<int32_t>(tokens.begin() + start, tokens.begin() + end), start, table, block_size,
                       true);
    const auto logits = f.model.forward(chunk, cache);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(all.size(), reference.size());
  EXPECT_LT(relative_l2(all.data(), reference.data(), all.size()), 1e-5);
}

TEST(Forward, BatchOfDifferentLengthsEqualsEachAlone) {
  Fixture f(RandomModelSpec{});
  const int vocab = 97, block_size = 4;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(17, vocab, 1), random_tokens(3, vocab, 2),
                                                     random_tokens(25, vocab, 3), random_tokens(1, vocab, 4)};
  // Each sequence gets its own physical blocks out of one shared cache, interleaved.
  kv::PagedLatentCache cache(f.model.cache_layout(block_size), 32);
  std::vector<std::vector<int32_t>> tables(prompts.size());
  auto order = f.blocks(32, 11);
  for (size_t s = 0, next = 0; s < prompts.size(); ++s)
    for (size_t b = 0; b < (prompts[s].size() + 1 + block_size - 1) / block_size + 1; ++b)
      tables[s].push_back(order[next++]);
  model::ForwardBatch batch;
  for (size_t s = 0; s < prompts.size(); ++s) batch.add_sequence(prompts[s], 0, tables[s], block_size, false);
  const auto batched = f.model.forward(batch, cache);
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto alone = f.full_logits(prompts[s]);
    EXPECT_LT(relative_l2(batched.data() + s * vocab, alone.data() + (prompts[s].size() - 1) * vocab, vocab), 1e-5)
        << "sequence " << s;
  }
  // A mixed step: one decode token for sequence 0 next to a prefill chunk of a new sequence.
  model::ForwardBatch mixed;
  const int32_t next_token = 5;
  mixed.add_sequence({next_token}, 17, tables[0], block_size, false);
  const auto fresh = random_tokens(9, vocab, 8);
  std::vector<int32_t> fresh_table = {order[30], order[31], order[29]};
  mixed.add_sequence(fresh, 0, fresh_table, block_size, false);
  const auto mixed_logits = f.model.forward(mixed, cache);
  auto extended = prompts[0];
  extended.push_back(next_token);
  const auto alone0 = f.full_logits(extended);
  const auto alone1 = f.full_logits(fresh);
  EXPECT_LT(relative_l2(mixed_logits.data(), alone0.data() + 17 * vocab, vocab), 1e-5);
  EXPECT_LT(relative_l2(mixed_logits.data() + vocab, alone1.data() + 8 * vocab, vocab), 1e-5);
}

TEST(Forward, SparseSelectionChangesTheResultOnlyPastTopK) {
  RandomModelSpec sparse_spec;
  sparse_spec.index_topk = 6;
  RandomModelSpec dense_spec = sparse_spec;
  dense_spec.index_topk = 1000;
  Fixture sparse(sparse_spec), dense(dense_spec);
  const auto tokens = random_tokens(24, 97, 21);
  const auto a = sparse.full_logits(tokens), b = dense.full_logits(tokens);
  const int vocab = 97;
  // Positions < index_topk see their whole context either way; later ones attend to 6 tokens.
  for (int pos = 0; pos < 6; ++pos)
    EXPECT_LT(relative_l2(a.data() + pos * vocab, b.data() + pos * vocab, vocab), 1e-6) << pos;
  double later = 0.0;
  for (int pos = 6; pos < 24; ++pos) later = std::max(later, relative_l2(a.data() + pos * vocab, b.data() + pos * vocab, vocab));
  EXPECT_GT(later, 1e-3);
}

namespace {

// 8 experts in 4 groups of 2, the best 2 groups compete, top-3; router logits whose sigmoid
// scores are {0.9, 0.1, 0.2, 0.3, 0.8, 0.7, 0.4, 0.45}.
struct RoutingCase {
  io::ModelConfig c;
  float logits[8];
  RoutingCase() {
    c.n_routed_experts = 8;
    c.n_group = 4;
    c.topk_group = 2;
    c.num_experts_per_tok = 3;
    const float probs[8] = {0.9f, 0.1f, 0.2f, 0.3f, 0.8f, 0.7f, 0.4f, 0.45f};
    for (int e = 0; e < 8; ++e) logits[e] = std::log(probs[e] / (1 - probs[e]));
  }
};

}  // namespace

TEST(Routing, GroupLimitedTopKWithBiasAndScaling) {
  RoutingCase r;
  io::ModelConfig& c = r.c;
  const float* logits = r.logits;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  // Sigmoid scores chosen through their logits; the bias steers choice but not the weights.
  const float bias[8] = {0, 0, 0, 0, 0, 0, 0.5f, 0};
  // Groups (2 experts each): g0 = 0.9+0.1 = 1.0, g1 = 0.5, g2 = 1.5, g3 = 0.9+0.45 = 1.35 -> keep g2, g3.
  std::vector<int32_t> experts;
  std::vector<float> weights;
  model::route_token(c, logits, bias, experts, weights);
  ASSERT_EQ(experts.size(), 3u);
  EXPECT_EQ(experts[0], 6);  // 0.4 + 0.5 bias
  EXPECT_EQ(experts[1], 4);
  EXPECT_EQ(experts[2], 5);
  const float total = 0.4f + 0.8f + 0.7f;
  EXPECT_NEAR(weights[0], 0.4f / total * 2.5f, 1e-5);
  EXPECT_NEAR(weights[1], 0.8f / total * 2.5f, 1e-5);
  EXPECT_NEAR(weights[2], 0.7f / total * 2.5f, 1e-5);
  // The choice is 0.25 from changing: the last chosen expert (5: 0.7) against the best one left in
  // the kept groups (7: 0.45); the groups are further apart (1.35 against g0's 1.0).
  float margin = 0.0f;
  model::route_token(c, logits, bias, experts, weights, &margin);
  EXPECT_NEAR(margin, 0.25f, 1e-5);
}

TEST(Routing, TheMarginIsTheNearerOfTheGroupAndExpertChoices) {
  RoutingCase r;
  io::ModelConfig& c = r.c;
  const float* logits = r.logits;
  // g0 = 0.9 + 0.1 + 0.3 bias = 1.3 against the kept g3's 1.35: the groups are 0.05 apart.
  const float bias[8] = {0, 0.3f, 0, 0, 0, 0, 0.5f, 0};
  std::vector<int32_t> experts;
  std::vector<float> weights;
  float margin = 0.0f;
  model::route_token(c, logits, bias, experts, weights, &margin);
  EXPECT_NEAR(margin, 0.05f, 1e-5);
  // One group, top-2: only the experts' gap (the second best, 0.8, against the third, 0.7).
  c.n_group = 1;
  c.topk_group = 1;
  c.num_experts_per_tok = 2;
  const float no_bias[8] = {};
  model::route_token(c, logits, no_bias, experts, weights, &margin);
  EXPECT_NEAR(margin, 0.1f, 1e-5);
  // Every expert chosen: nothing is left out.
  c.num_experts_per_tok = 8;
  model::route_token(c, logits, no_bias, experts, weights, &margin);
  EXPECT_TRUE(std::isinf(margin));
}

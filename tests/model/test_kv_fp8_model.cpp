// The CPU path with an FP8 KV cache (kv::CacheDtype::kFp8E4m3): what it costs against the fp32
// cache on the bundled model and on a random model, by next-token KL, top-1 agreement and
// logits' relative L2 over a prefill whose attention reads every row back from the cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "model/glm5.h"
#include "quant/checkpoint_quantizer.h"
#include "random_model.h"
#include "support/numerics.h"

using namespace glms;

namespace {

std::vector<float> prefill_logits(const model::Glm5Model& m, const std::vector<int32_t>& prompt, kv::CacheDtype dtype) {
  const int block_size = 16, blocks = static_cast<int>(prompt.size() + block_size - 1) / block_size;
  kv::CacheLayout layout = m.cache_layout(block_size);
  layout.dtype = dtype;
  kv::PagedLatentCache cache(std::move(layout), blocks);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  model::ForwardBatch batch;
  batch.add_sequence(prompt, 0, table, block_size, true);
  return m.forward(batch, cache);
}

struct Cost {
  quant::QualityStats stats;
  double logits_l2 = 0.0;
};

Cost fp8_cost(const model::Glm5Model& m, const std::vector<int32_t>& prompt) {
  const auto reference = prefill_logits(m, prompt, kv::CacheDtype::kAuto);
  const auto fp8 = prefill_logits(m, prompt, kv::CacheDtype::kFp8E4m3);
  Cost cost;
  cost.stats.add(reference.data(), fp8.data(), static_cast<int64_t>(prompt.size()) - 1, m.config().vocab_size,
                 prompt.data() + 1);
  cost.logits_l2 = glms::testing::relative_l2(fp8, reference);
  return cost;
}

std::vector<int32_t> prompt_of(int length, int vocab) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back(static_cast<int32_t>((int64_t{i} * 7919 + 13) % vocab));
  return prompt;
}

}  // namespace

TEST(KvCacheFp8, BundledModelFollowsTheFp32Cache) {
  const model::Glm5Model m(model::load_weights(GLMS_SOURCE_DIR "/models/glm5-tiny-code"));
  const Cost cost = fp8_cost(m, prompt_of(160, m.config().vocab_size));
  std::printf("bundled model, 160 positions: mean KL %.2e nats, top-1 agreement %.1f%%, logits relative L2 %.2e\n",
              cost.stats.mean_kl(), 100 * cost.stats.top1(), cost.logits_l2);
  EXPECT_GT(cost.logits_l2, 0.0);  // the cache's dtype reaches attention
  EXPECT_LT(cost.stats.mean_kl(), 0.05);
  EXPECT_GE(cost.stats.top1(), 0.9);
}

// A random model, with its indexer's top-k covering the whole prompt (the rows' rounding alone)
// and with a top-k of 9 of 96 positions, where rounded indexer keys also move near-tied
// positions in or out of the selection (random models are full of near ties).
TEST(KvCacheFp8, RandomModelFollowsTheFp32Cache) {
  for (const int top_k : {128, 9}) {
    glms::testing::TempDir dir("kv_fp8");
    glms::testing::RandomModelSpec spec;
    spec.kv_lora_rank = 192;  // a whole group of 128 and a part one
    spec.index_topk = top_k;
    const model::Glm5Model m(model::load_weights(glms::testing::write_random_model(dir.path, spec).string()));
    const Cost cost = fp8_cost(m, prompt_of(96, spec.vocab_size));
    std::printf("random model, top-k %d, 96 positions: mean KL %.2e nats, top-1 agreement %.1f%%, logits relative L2 "
                "%.2e\n",
                top_k, cost.stats.mean_kl(), 100 * cost.stats.top1(), cost.logits_l2);
    EXPECT_GT(cost.logits_l2, 0.0);
    EXPECT_LT(cost.stats.mean_kl(), 0.05) << "top-k " << top_k;
    if (top_k >= 96) {
      EXPECT_LT(cost.logits_l2, 0.05);
      EXPECT_GE(cost.stats.top1(), 0.9);
    }
  }
}

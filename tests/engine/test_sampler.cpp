// The sampler's filters and determinism, checked statistically over many seeded draws.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

using namespace glms::engine;

namespace {
// Logits for probabilities proportional to 8, 4, 2, 1, 1 (ids 0..4) at temperature 1.
const std::vector<float> kLogits = {std::log(8.0f), std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};

std::map<int32_t, int> histogram(const SamplingParams& params, int draws) {
  Sampler sampler(params.seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(kLogits.data(), 5, params)];
  return counts;
}
}  // namespace

TEST(Sampler, GreedyAtTemperatureZero) {
  SamplingParams params;
  params.temperature = 0.0f;
  EXPECT_EQ(Sampler(1).sample(kLogits.data(), 5, params), 0);
  const float tie[] = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(argmax(tie, 3), 1);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  SamplingParams params;
  params.seed = 3;
  const auto counts = histogram(params, 16000);
  EXPECT_NEAR(counts.at(0) / 16000.0, 8.0 / 16, 0.015);
  EXPECT_NEAR(counts.at(1) / 16000.0, 4.0 / 16, 0.015);
  EXPECT_NEAR(counts.at(3) / 16000.0, 1.0 / 16, 0.01);
}

TEST(Sampler, FiltersKeepOnlyWhatTheyShould) {
  SamplingParams top_k;
  top_k.top_k = 2;
  for (const auto& [id, n] : histogram(top_k, 2000)) EXPECT_LT(id, 2);
  SamplingParams top_p;
  top_p.top_p = 0.7f;  // 8/15 = 0.53 < 0.7 <= 12/15 = 0.8: ids 0 and 1
  for (const auto& [id, n] : histogram(top_p, 2000)) EXPECT_LT(id, 2);
  SamplingParams min_p;
  min_p.min_p = 0.3f;  // floor 0.3 x 8 = 2.4: ids 0 (8) and 1 (4)
  const auto counts = histogram(min_p, 3000);
  for (const auto& [id, n] : counts) EXPECT_LT(id, 2);
  EXPECT_NEAR(counts.at(0) / 3000.0, 8.0 / 12, 0.03);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.seed = 11;
  Sampler a(params.seed), b(params.seed);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(kLogits.data(), 5, params), b.sample(kLogits.data(), 5, params));
}

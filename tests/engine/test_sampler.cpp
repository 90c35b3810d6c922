// The sampler's filters and determinism, checked statistically over many seeded draws.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

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

// top_k's boundary among equal logits keeps the lower ids.
TEST(Sampler, TopKTiesKeepTheLowerIds) {
  const float logits[] = {1.0f, 3.0f, 2.0f, 2.0f, 2.0f};
  SamplingParams params;
  params.top_k = 3;
  std::vector<float> probs(5);
  Sampler::probabilities(logits, 5, params, probs.data());
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_GT(probs[1], 0.0f);
  EXPECT_GT(probs[2], 0.0f);
  EXPECT_GT(probs[3], 0.0f);
  EXPECT_EQ(probs[4], 0.0f);
  EXPECT_NEAR(probs[1] + probs[2] + probs[3], 1.0f, 1e-6f);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.seed = 11;
  Sampler a(params.seed), b(params.seed);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(kLogits.data(), 5, params), b.sample(kLogits.data(), 5, params));
}

TEST(Sampler, ProbabilitiesAreWhatSampleDrawsFrom) {
  std::vector<float> probs(5);
  SamplingParams top_k;
  top_k.top_k = 2;
  Sampler::probabilities(kLogits.data(), 5, top_k, probs.data());
  EXPECT_NEAR(probs[0], 8.0 / 12, 1e-6);
  EXPECT_NEAR(probs[1], 4.0 / 12, 1e-6);
  EXPECT_EQ(probs[2] + probs[3] + probs[4], 0.0f);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler::probabilities(kLogits.data(), 5, greedy, probs.data());
  EXPECT_EQ(probs, (std::vector<float>{1, 0, 0, 0, 0}));
}

// top_k and top_p over a GLM-sized vocabulary find their kept sets without sorting every
// candidate (a heap of the k largest values; logit buckets): the kept set and probabilities must
// be those of the full sort (by logit, then id), ties included.
TEST(Sampler, TopPOverALargeVocabularyKeepsTheSortedPrefix) {
  const int vocab = 154880;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  for (int i = 0; i < vocab; i += 97) logits[i] = logits[(i * 7) % vocab];  // equal logits
  // Peaked (temperature 0.7) to nearly flat (temperature 40: most of the vocabulary is kept).
  // With top_k: the k best by logit then id (5000 > the 4096 sorted directly: buckets over them).
  for (const auto& [top_p, temperature, min_p, top_k] :
       {std::tuple{0.5f, 0.7f, 0.0f, 0}, {0.9f, 1.0f, 0.0f, 0}, {0.999f, 1.3f, 0.0f, 0}, {0.95f, 0.8f, 0.01f, 0},
        {0.95f, 40.0f, 0.0f, 0}, {0.3f, 40.0f, 0.5f, 0}, {1.0f, 1.0f, 0.0f, 50}, {0.8f, 0.9f, 0.0f, 20},
        {0.9f, 40.0f, 0.0f, 5000}}) {
    SamplingParams params;
    params.temperature = temperature;
    params.top_p = top_p;
    params.min_p = min_p;
    params.top_k = top_k;
    std::vector<float> probs(vocab);
    Sampler::probabilities(logits.data(), vocab, params, probs.data());

    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    if (top_k > 0) order.resize(top_k);
    const float max_logit = logits[order[0]];
    std::vector<double> weight(vocab);
    double total = 0.0;
    for (int32_t id : order) total += weight[id] = std::exp((logits[id] - max_logit) * (1.0f / temperature));
    size_t keep = 0;
    double mass = 0.0;
    while (keep < order.size() && mass < top_p) mass += weight[order[keep++]] / total;
    std::vector<float> expected(vocab, 0.0f);
    double kept = 0.0;
    const double floor = weight[order[0]] / total * min_p;
    for (size_t i = 0; i < keep; ++i)
      if (weight[order[i]] / total >= floor) kept += weight[order[i]] / total;
    for (size_t i = 0; i < keep; ++i)
      if (weight[order[i]] / total >= floor) expected[order[i]] = static_cast<float>(weight[order[i]] / total / kept);
    size_t nonzero = 0;
    for (int i = 0; i < vocab; ++i) {
      ASSERT_EQ(probs[i] > 0.0f, expected[i] > 0.0f) << "id " << i << " top_p " << top_p << " top_k " << top_k;
      nonzero += probs[i] > 0.0f;
      EXPECT_NEAR(probs[i], expected[i], 1e-6f * expected[i] + 1e-12f);
    }
    EXPECT_GT(nonzero, 1u);
  }
}

namespace {

// A Markov chain over 5 tokens stands in for the models: the target's next-token distribution
// after token t is kTarget[t], the draft's kDraft[t] (deliberately different, and sometimes
// zero where the target is not).
constexpr int kVocab = 5;
const float kTarget[kVocab][kVocab] = {{0.40f, 0.25f, 0.15f, 0.12f, 0.08f},
                                       {0.10f, 0.30f, 0.30f, 0.20f, 0.10f},
                                       {0.25f, 0.10f, 0.10f, 0.15f, 0.40f},
                                       {0.20f, 0.20f, 0.20f, 0.20f, 0.20f},
                                       {0.05f, 0.45f, 0.15f, 0.15f, 0.20f}};
const float kDraft[kVocab][kVocab] = {{0.10f, 0.60f, 0.10f, 0.20f, 0.00f},
                                      {0.30f, 0.30f, 0.10f, 0.10f, 0.20f},
                                      {0.05f, 0.05f, 0.60f, 0.15f, 0.15f},
                                      {0.50f, 0.00f, 0.20f, 0.10f, 0.20f},
                                      {0.20f, 0.20f, 0.20f, 0.20f, 0.20f}};

// Chi-square statistic of the first three tokens of `runs` speculative decodes (two drafts a
// step, starting after token 0) against the target chain's exact joint distribution.
// `rejection_sampling` false accepts every draft, the mistake the test must catch.
double first_three_chi_square(int runs, bool rejection_sampling) {
  Sampler sampler(2026);
  std::vector<int> counts(kVocab * kVocab * kVocab, 0);
  constexpr int K = 2;
  for (int run = 0; run < runs; ++run) {
    std::vector<int32_t> emitted;
    int32_t last = 0;
    while (emitted.size() < 3) {
      int32_t drafts[K];
      std::vector<float> q(K * kVocab), p((K + 1) * kVocab);
      std::copy(kDraft[last], kDraft[last] + kVocab, q.begin());
      drafts[0] = sampler.sample_from(q.data(), kVocab);
      std::copy(kDraft[drafts[0]], kDraft[drafts[0]] + kVocab, q.begin() + kVocab);
      drafts[1] = sampler.sample_from(q.data() + kVocab, kVocab);
      const int32_t context[K + 1] = {last, drafts[0], drafts[1]};
      for (int k = 0; k <= K; ++k) std::copy(kTarget[context[k]], kTarget[context[k]] + kVocab, p.begin() + k * kVocab);
      DraftVerdict verdict{K, sampler.sample_from(p.data() + K * kVocab, kVocab)};
      if (rejection_sampling) verdict = sampler.verify_drafts(drafts, K, q.data(), p.data(), kVocab);
      emitted.insert(emitted.end(), drafts, drafts + verdict.accepted);
      emitted.push_back(verdict.next);
      last = emitted.back();
    }
    ++counts[(emitted[0] * kVocab + emitted[1]) * kVocab + emitted[2]];
  }
  double chi_square = 0.0;
  for (int a = 0; a < kVocab; ++a)
    for (int b = 0; b < kVocab; ++b)
      for (int c = 0; c < kVocab; ++c) {
        const double expected = runs * static_cast<double>(kTarget[0][a]) * kTarget[a][b] * kTarget[b][c];
        const double diff = counts[(a * kVocab + b) * kVocab + c] - expected;
        chi_square += diff * diff / expected;
      }
  return chi_square;
}

}  // namespace

// Speculative rejection sampling keeps the target's distribution: over 100k seeded runs the
// 125 joint outcomes of the first three tokens pass a chi-square test (124 degrees of freedom,
// 190 is the 0.9999 quantile), while accepting every draft fails it by far.
TEST(SpeculativeSampling, EmittedTokensFollowTheTargetDistribution) {
  const double chi_square = first_three_chi_square(100000, true);
  std::printf("chi-square with rejection sampling %.1f, accepting every draft %.1f\n", chi_square,
              first_three_chi_square(100000, false));
  EXPECT_LT(chi_square, 190.0);
  EXPECT_GT(first_three_chi_square(100000, false), 1000.0);
}

TEST(SpeculativeSampling, OneHotDistributionsAcceptWhileEqualToTheArgmax) {
  Sampler sampler(1);
  auto one_hot = [](std::initializer_list<int> ids) {
    std::vector<float> v;
    for (int id : ids) {
      std::vector<float> row(kVocab, 0.0f);
      row[id] = 1.0f;
      v.insert(v.end(), row.begin(), row.end());
    }
    return v;
  };
  const int32_t drafts[3] = {2, 4, 1};
  const auto q = one_hot({2, 4, 1});
  for (int trial = 0; trial < 20; ++trial) {
    const DraftVerdict all = sampler.verify_drafts(drafts, 3, q.data(), one_hot({2, 4, 1, 3}).data(), kVocab);
    EXPECT_EQ(all.accepted, 3);
    EXPECT_EQ(all.next, 3);
    const DraftVerdict second_wrong = sampler.verify_drafts(drafts, 3, q.data(), one_hot({2, 0, 1, 3}).data(), kVocab);
    EXPECT_EQ(second_wrong.accepted, 1);
    EXPECT_EQ(second_wrong.next, 0);
  }
}

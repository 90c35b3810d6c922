// Workloads through the bundled model's tokenizer: every prompt is exactly as long as asked and
// re-encodes to its own ids; shared prefixes are shared token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bench/workload.h"
#include "core/error.h"

using namespace glms::bench;
using glms::text::Tokenizer;

namespace {
const Tokenizer& tiny() {
  static const Tokenizer tok = Tokenizer::load(GLMS_SOURCE_DIR "/models/glm5-tiny-code");
  return tok;
}
}  // namespace

TEST(Workload, RandomPromptsHaveExactLengths) {
  WorkloadSpec spec;
  spec.input_len = 64;
  spec.output_len = 8;
  spec.seed = 3;
  const auto prompts = make_prompts(tiny(), spec, 24);
  ASSERT_EQ(prompts.size(), 24u);
  for (const Prompt& p : prompts) {
    EXPECT_EQ(p.ids.size(), 64u);
    EXPECT_EQ(tiny().encode(p.text, false), p.ids);
    EXPECT_EQ(p.output_len, 8);
    EXPECT_EQ(p.prefix_group, -1);
    for (int32_t id : p.ids) EXPECT_FALSE(tiny().is_special(id));
  }
  EXPECT_NE(prompts[0].ids, prompts[1].ids);
}

TEST(Workload, LongPromptIsExact) {
  WorkloadSpec spec;
  spec.input_len = 3000;
  spec.output_len = 1;
  const auto prompts = make_prompts(tiny(), spec, 2);
  for (const Prompt& p : prompts) {
    EXPECT_EQ(p.ids.size(), 3000u);
    EXPECT_EQ(tiny().encode(p.text, false).size(), 3000u);
  }
}

TEST(Workload, RangeRatioBoundsLengths) {
  WorkloadSpec spec;
  spec.input_len = 100;
  spec.output_len = 40;
  spec.range_ratio = 0.5;
  const auto prompts = make_prompts(tiny(), spec, 40);
  int min_in = 1 << 30, max_in = 0;
  for (const Prompt& p : prompts) {
    const int n = static_cast<int>(p.ids.size());
    EXPECT_GE(n, 50);
    EXPECT_LE(n, 150);
    EXPECT_GE(p.output_len, 20);
    EXPECT_LE(p.output_len, 60);
    EXPECT_EQ(tiny().encode(p.text, false), p.ids);
    min_in = std::min(min_in, n);
    max_in = std::max(max_in, n);
  }
  EXPECT_LT(min_in, max_in);
}

TEST(Workload, SharedPrefixesGiveTheHitRatio) {
  WorkloadSpec spec;
  spec.input_len = 200;
  spec.output_len = 4;
  spec.prefix_hit = 0.6;
  spec.num_prefixes = 3;
  const auto prompts = make_prompts(tiny(), spec, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    ASSERT_EQ(p.ids.size(), 200u);
    EXPECT_EQ(tiny().encode(p.text, false), p.ids);
    EXPECT_EQ(p.prefix_len, 120);
    EXPECT_EQ(p.prefix_group, static_cast<int>(i % 3));
    const Prompt& q = prompts[(i + 3) % prompts.size()];
    EXPECT_TRUE(std::equal(p.ids.begin(), p.ids.begin() + 120, q.ids.begin())) << i;
    EXPECT_FALSE(std::equal(p.ids.begin() + 120, p.ids.end(), q.ids.begin() + 120)) << i;
  }
  // Different groups have different prefixes.
  EXPECT_FALSE(std::equal(prompts[0].ids.begin(), prompts[0].ids.begin() + 120, prompts[1].ids.begin()));
}

TEST(Workload, DeterministicWhateverTheThreads) {
  WorkloadSpec spec;
  spec.input_len = 48;
  spec.prefix_hit = 0.5;
  spec.seed = 11;
  const auto a = make_prompts(tiny(), spec, 10, 1);
  const auto b = make_prompts(tiny(), spec, 10, 3);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].ids, b[i].ids);
  spec.seed = 12;
  EXPECT_NE(make_prompts(tiny(), spec, 1, 1)[0].ids, a[0].ids);
}

TEST(Workload, RejectsBadSpecs) {
  WorkloadSpec spec;
  spec.prefix_hit = 1.0;
  EXPECT_THROW(make_prompts(tiny(), spec, 1), glms::Error);
  spec.prefix_hit = 0;
  spec.input_len = 0;
  EXPECT_THROW(make_prompts(tiny(), spec, 1), glms::Error);
}

TEST(Workload, PresetsMatchTheWriteUps) {
  const auto agentic = find_preset("agentic");
  ASSERT_TRUE(agentic);
  EXPECT_EQ(agentic->input_len, 20000);
  EXPECT_EQ(agentic->output_len, 1000);
  EXPECT_DOUBLE_EQ(agentic->prefix_hit, 0.6);
  EXPECT_EQ(agentic->request_rates, (std::vector<double>{0.5, 1.0, 1.5, 2.0, 2.25, 2.4}));
  const auto single = find_preset("single-stream");
  ASSERT_TRUE(single);
  EXPECT_EQ(single->input_len, 10000);
  EXPECT_EQ(single->output_len, 1500);
  EXPECT_EQ(single->concurrencies, std::vector<int>{1});
  const auto sweep = find_preset("batch-sweep");
  ASSERT_TRUE(sweep);
  EXPECT_EQ(sweep->input_len, 2048);
  EXPECT_EQ(sweep->concurrencies.back(), 128);
  const auto inter = find_preset("interactivity");
  ASSERT_TRUE(inter);
  EXPECT_EQ(inter->input_len, 8192);
  EXPECT_EQ(inter->output_len, 1024);
  EXPECT_FALSE(find_preset("nope"));
}

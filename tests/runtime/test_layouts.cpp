// Every parallel layout on CPU ranks (threads) against one rank: the golden fixtures and the
// bundled model at TP2, TP4, DP2+EP2, DP4+EP4 and TP2 x DP2, with experts whole or split by
// width; logits within 1e-6 relative L2 and greedy tokens identical; layouts that do not divide
// the model are refused.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "engine/generator.h"
#include "io/safetensors.h"
#include "model/glm5.h"
#include "runtime/cpu_ranks.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::relative_l2;

namespace {

const std::filesystem::path kSource = GLMS_SOURCE_DIR;
const std::string kGlm52 = (kSource / "tests/golden/glm52-random").string();
const std::string kGlm5 = (kSource / "tests/golden/glm5-random").string();
const std::string kBundled = (kSource / "models/glm5-tiny-code").string();

runtime::ParallelLayout layout(int tp, int dp, bool ep) { return {tp, dp, ep}; }

std::string name_of(const runtime::ParallelLayout& l) {
  return "TP" + std::to_string(l.tensor_parallel) + "xDP" + std::to_string(l.data_parallel) +
         (l.expert_parallel ? "+EP" : "");
}

std::vector<int32_t> golden_ids(const std::string& dir, const std::string& name) {
  const io::Checkpoint golden = io::Checkpoint::open(std::filesystem::path(dir) / "golden.safetensors");
  const std::vector<int64_t> ids = io::read_i64(golden.get(name));
  return {ids.begin(), ids.end()};
}

// Every prompt's logits at every position, each prompt on its own data-parallel rank (prompts
// beyond the ranks wait for the next step; ranks beyond the prompts idle).
std::vector<std::vector<float>> prompt_logits(runtime::Executor& executor, const std::vector<std::vector<int32_t>>& prompts) {
  const int block_size = 16, dp = executor.data_parallel_size();
  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<int>(p.size()));
  model::CacheShape shape;
  shape.block_size = block_size;
  shape.num_blocks = (longest + block_size - 1) / block_size + 1;
  shape.max_tokens = longest;
  shape.max_sequences = 1;
  shape.max_logits = longest;
  shape.max_context = longest;
  executor.allocate(shape);
  std::vector<int32_t> table(shape.num_blocks);
  for (int b = 0; b < shape.num_blocks; ++b) table[b] = shape.num_blocks - 1 - b;
  std::vector<std::vector<float>> logits(prompts.size());
  for (size_t first = 0; first < prompts.size(); first += dp) {
    std::vector<runtime::RankStep> steps(dp);
    for (int r = 0; r < dp && first + r < prompts.size(); ++r) {
      steps[r].batch.add_sequence(prompts[first + r], 0, table, block_size, true);
      model::RowOutput logits;
      logits.kind = model::RowOutput::Kind::kLogits;
      steps[r].outputs.assign(prompts[first + r].size(), logits);
    }
    std::vector<runtime::RankResult> results = executor.forward(steps, false);
    for (int r = 0; r < dp && first + r < prompts.size(); ++r) logits[first + r] = results[r].logits.full;
  }
  return logits;
}

std::vector<std::vector<int32_t>> fixture_prompts(const std::string& dir) {
  return {golden_ids(dir, "prompt_ids"), golden_ids(dir, "extra_prompt_ids_0"), golden_ids(dir, "extra_prompt_ids_1"),
          golden_ids(dir, "extra_prompt_ids_2")};
}

void expect_same_logits(const std::string& dir, const runtime::ParallelLayout& l,
                        const std::vector<std::vector<int32_t>>& prompts) {
  const auto one = runtime::make_cpu_executor(dir, runtime::ParallelLayout{});
  const auto sharded = runtime::make_cpu_executor(dir, l);
  const auto expected = prompt_logits(*one, prompts);
  const auto actual = prompt_logits(*sharded, prompts);
  const int vocab = one->config().vocab_size;
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_LT(relative_l2(actual[p], expected[p]), 1e-6) << name_of(l) << " prompt " << p;
    for (size_t row = 0; row < prompts[p].size(); ++row) {
      const float* a = actual[p].data() + row * vocab;
      const float* e = expected[p].data() + row * vocab;
      ASSERT_EQ(ops::argmax(a, vocab), ops::argmax(e, vocab)) << name_of(l) << " prompt " << p << " position " << row;
    }
  }
}

}  // namespace

TEST(Layouts, ShardedFixtureLogitsMatchOneRank) {
  const auto prompts = fixture_prompts(kGlm52);
  for (const runtime::ParallelLayout& l :
       {layout(2, 1, false), layout(4, 1, false), layout(2, 1, true), layout(1, 2, true), layout(1, 4, true),
        layout(2, 2, true), layout(2, 2, false), layout(1, 2, false)})
    expect_same_logits(kGlm52, l, prompts);
}

TEST(Layouts, ShardedBundledModelLogitsMatchOneRank) {
  const std::vector<std::vector<int32_t>> prompts = {golden_ids(kBundled, "prompt_ids"),
                                                     glms::testing::random_tokens(40, 8000, 3),
                                                     glms::testing::random_tokens(7, 8000, 4)};
  for (const runtime::ParallelLayout& l : {layout(4, 1, false), layout(1, 2, true), layout(2, 2, true)})
    expect_same_logits(kBundled, l, prompts);
}

TEST(Layouts, GreedyTokensOfTheBundledModelMatchOneRank) {
  const std::vector<int32_t> prompt = golden_ids(kBundled, "prompt_ids");
  engine::GenerateOptions options;
  options.max_tokens = 16;
  options.sampling.temperature = 0.0f;
  options.prefill_chunk = 64;  // several chunks through the parallel path
  const auto one = runtime::make_cpu_executor(kBundled, runtime::ParallelLayout{});
  const auto expected = engine::generate(*runtime::rank_zero_runner(*one), prompt, options);
  ASSERT_EQ(expected.output_ids.size(), 16u);
  for (const runtime::ParallelLayout& l : {layout(2, 1, false), layout(1, 2, true), layout(1, 4, true), layout(2, 2, true)}) {
    const auto sharded = runtime::make_cpu_executor(kBundled, l);
    const auto result = engine::generate(*runtime::rank_zero_runner(*sharded), prompt, options);
    EXPECT_EQ(result.output_ids, expected.output_ids) << name_of(l);
  }
}

TEST(Layouts, ThatDoNotDivideTheModelAreRefusedWithWhatWouldDivide) {
  auto refusal = [](const std::string& dir, const runtime::ParallelLayout& l) -> std::string {
    try {
      runtime::make_cpu_executor(dir, l);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // glm5-random: 3 heads, 11 experts of width 20.
  EXPECT_NE(refusal(kGlm5, layout(2, 1, false)).find("3 attention heads"), std::string::npos);
  EXPECT_NE(refusal(kGlm5, layout(1, 2, true)).find("11 routed experts"), std::string::npos);
  EXPECT_NE(refusal(kGlm5, layout(1, 3, false)).find("intermediate size 20"), std::string::npos);
  EXPECT_NE(refusal(kGlm52, layout(3, 1, false)).find("4 attention heads"), std::string::npos);
}

TEST(Layouts, AFailingRankLeavesTheExecutorUsable) {
  const auto sharded = runtime::make_cpu_executor(kGlm52, layout(2, 2, true));
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {8, 9}};
  const auto before = prompt_logits(*sharded, prompts);
  // A token outside the vocabulary fails on the ranks of data-parallel rank 1 while rank 0's
  // peers wait in the MoE collectives: everyone must come back with the error.
  std::vector<runtime::RankStep> steps(2);
  const std::vector<int32_t> table = {0};
  steps[0].batch.add_sequence({1, 2}, 0, table, 16, false);
  steps[0].outputs.resize(1);
  steps[1].batch.add_sequence({1, 100000}, 0, table, 16, false);
  steps[1].outputs.resize(1);
  try {
    sharded->forward(steps, false);
    FAIL() << "an invalid token id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_EQ(prompt_logits(*sharded, prompts), before);
}

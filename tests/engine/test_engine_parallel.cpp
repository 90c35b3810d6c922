// The serving engine over parallel layouts on CPU ranks: requests spread over data-parallel
// ranks produce exactly the tokens one rank produces alone, with each rank's prefix cache,
// preemption and cancellation; speculation drafts on every rank in lockstep.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/generator.h"
#include "pending_request.h"
#include "random_model.h"
#include "runtime/cpu_ranks.h"

using namespace glms;
using glms::testing::Collected;
using glms::testing::greedy_request;
using glms::testing::Pending;

namespace {

std::vector<int32_t> tokens_of(int count, uint64_t seed) { return glms::testing::prompt_tokens(count, 97, seed); }

class ParallelEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new glms::testing::TempDir("parallel-engine");
    glms::testing::RandomModelSpec spec;
    spec.num_attention_heads = 4;  // TP2 divides heads, widths (56, 12) and experts (8)
    spec.index_topk = 12;
    path_ = new std::string(glms::testing::write_random_model(dir_->path / "m", spec).string());
    model_ = new model::Glm5Model(model::load_weights(*path_));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
    delete dir_;
  }
  static std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int max_tokens) {
    engine::GenerateOptions options;
    options.max_tokens = max_tokens;
    options.sampling.temperature = 0.0f;
    options.ignore_eos = true;
    return engine::generate(*model_, prompt, options).output_ids;
  }
  static std::unique_ptr<runtime::Executor> executor(int tp, int dp, bool ep) {
    return runtime::make_cpu_executor(*path_, runtime::ParallelLayout{tp, dp, ep});
  }
  static glms::testing::TempDir* dir_;
  static std::string* path_;
  static model::Glm5Model* model_;
};
glms::testing::TempDir* ParallelEngine::dir_ = nullptr;
std::string* ParallelEngine::path_ = nullptr;
model::Glm5Model* ParallelEngine::model_ = nullptr;

void expect_idle(engine::Engine& engine) {
  const engine::EngineStats stats = engine.stats();
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
  for (size_t r = 0; r < stats.ranks.size(); ++r)
    EXPECT_EQ(stats.ranks[r].num_free_blocks, stats.ranks[r].num_blocks) << "a block leaked on rank " << r;
}

}  // namespace

TEST_F(ParallelEngine, ConcurrentRequestsOnEveryLayoutEqualEachAlone) {
  struct Case {
    int tp, dp;
    bool ep;
  };
  for (const Case& c : {Case{1, 2, true}, Case{2, 2, true}, Case{2, 1, false}, Case{1, 4, false}}) {
    engine::EngineConfig config;
    config.max_batch_tokens = 24;  // chunked prefills beside decodes on each rank
    config.max_num_seqs = 3;       // and a waiting queue
    config.enable_prefix_cache = false;
    engine::Engine engine(executor(c.tp, c.dp, c.ep), config);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::unique_ptr<Pending>> requests;
    for (int i = 0; i < 10; ++i) {
      prompts.push_back(tokens_of(5 + 7 * i % 31, 100 + i));
      requests.push_back(std::make_unique<Pending>(engine, greedy_request(prompts.back(), 5 + i % 4)));
    }
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(requests[i]->get().tokens, alone(prompts[i], 5 + i % 4))
          << "TP" << c.tp << " DP" << c.dp << (c.ep ? " EP" : "") << " request " << i;
    const engine::EngineStats stats = engine.stats();
    ASSERT_EQ(static_cast<int>(stats.ranks.size()), c.dp);
    expect_idle(engine);
  }
}

TEST_F(ParallelEngine, EachDataParallelRankKeepsItsOwnPrefixCache) {
  engine::EngineConfig config;
  config.block_size = 8;
  engine::Engine engine(executor(1, 2, true), config);
  const auto prefix = tokens_of(40, 5);
  auto first = prefix, second = prefix;
  first.push_back(11);
  second.push_back(12);
  // An unrelated request keeps rank 0 busy, so that the first prefix goes to rank 1.
  Pending busy(engine, greedy_request(tokens_of(9, 77), 30));
  const Collected a = Pending(engine, greedy_request(first, 5)).get();
  const Collected b = Pending(engine, greedy_request(second, 5)).get();
  busy.get();
  EXPECT_EQ(a.last.cached_prompt_tokens, 0);
  EXPECT_EQ(b.last.cached_prompt_tokens, 40);  // found on the rank that computed it
  EXPECT_EQ(b.tokens, alone(second, 5));
  const engine::EngineStats stats = engine.stats();
  int64_t hits = 0;
  for (const engine::RankStats& r : stats.ranks) hits += r.prefix_cache_hits;
  EXPECT_EQ(hits, 40);
  EXPECT_EQ(stats.ranks[0].prefix_cache_hits + stats.ranks[1].prefix_cache_hits, stats.prefix_cache_hits);
  expect_idle(engine);
}

TEST_F(ParallelEngine, PreemptionOnEachRankKeepsOutputsExact) {
  engine::EngineConfig config;
  config.block_size = 4;
  config.max_model_len = 48;
  config.kv_cache_bytes = model_->cache_layout(4).bytes_per_token() * 4 * 14;  // 56 tokens a rank
  config.max_num_seqs = 8;
  engine::Engine engine(executor(1, 2, true), config);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Pending>> requests;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(tokens_of(10 + 3 * i, 300 + i));
    requests.push_back(std::make_unique<Pending>(engine, greedy_request(prompts.back(), 14)));
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(requests[i]->get().tokens, alone(prompts[i], 14)) << "request " << i;
  EXPECT_GT(engine.stats().num_preemptions, 0);
  expect_idle(engine);
}

TEST_F(ParallelEngine, CancelOnADataParallelRankFreesItsBlocks) {
  engine::Engine engine(executor(1, 2, true), {});
  Pending other(engine, greedy_request(tokens_of(12, 8), 20));
  const engine::RequestOutput out =
      glms::testing::cancel_from_callback(engine, greedy_request(tokens_of(30, 9), 2000), 2);
  EXPECT_EQ(out.finish_reason, "abort");
  EXPECT_EQ(other.get().tokens, alone(tokens_of(12, 8), 20));
  expect_idle(engine);
}

TEST_F(ParallelEngine, SpeculativeDecodingDraftsOnEveryRankInLockstep) {
  engine::EngineConfig config;
  config.speculative_steps = 2;
  config.max_batch_tokens = 32;
  engine::Engine engine(executor(1, 2, true), config);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Pending>> requests;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(tokens_of(6 + 9 * i, 500 + i));
    requests.push_back(std::make_unique<Pending>(engine, greedy_request(prompts.back(), 9 + i)));
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(requests[i]->get().tokens, alone(prompts[i], 9 + i)) << "request " << i;
  const engine::EngineStats stats = engine.stats();
  EXPECT_GT(stats.spec_draft_tokens, 0);
  expect_idle(engine);
}

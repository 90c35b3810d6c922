// The serving engine against the single-request generator: batching, chunking, the prefix
// cache and preemption must not change a greedy request's tokens, and every block comes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "pending_request.h"
#include "random_model.h"

using namespace glms;
using namespace std::chrono_literals;
using glms::testing::Collected;
using glms::testing::Pending;
using glms::testing::greedy_request;

namespace {

std::vector<int32_t> random_tokens(int count, int vocab, uint64_t seed) {
  return glms::testing::prompt_tokens(count, vocab, seed);
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new glms::testing::TempDir("engine");
    glms::testing::RandomModelSpec spec;
    spec.index_topk = 12;
    model_ = new model::Glm5Model(model::load_weights(glms::testing::write_random_model(dir_->path / "m", spec).string()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int max_tokens) {
    engine::GenerateOptions options;
    options.max_tokens = max_tokens;
    options.sampling.temperature = 0.0f;
    options.ignore_eos = true;
    return engine::generate(*model_, prompt, options).output_ids;
  }
  static glms::testing::TempDir* dir_;
  static model::Glm5Model* model_;
};
glms::testing::TempDir* EngineTest::dir_ = nullptr;
model::Glm5Model* EngineTest::model_ = nullptr;

void expect_idle(engine::Engine& engine) {
  const engine::EngineStats stats = engine.stats();
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
  EXPECT_EQ(stats.num_free_blocks, stats.num_blocks) << "a block leaked";
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
}

}  // namespace

TEST_F(EngineTest, OneRequestMatchesTheGenerator) {
  engine::Engine engine(*model_, {});
  const auto prompt = random_tokens(23, 97, 1);
  Pending request(engine, greedy_request(prompt, 12));
  const Collected result = request.get();
  EXPECT_EQ(result.tokens, alone(prompt, 12));
  EXPECT_EQ(result.last.finish_reason, "length");
  EXPECT_EQ(result.last.prompt_tokens, 23);
  EXPECT_EQ(result.last.completion_tokens, 12);
  expect_idle(engine);
}

TEST_F(EngineTest, ConcurrentRequestsEqualEachAlone) {
  engine::EngineConfig config;
  config.max_batch_tokens = 24;  // forces chunked prefills mixed with decodes
  config.max_num_seqs = 6;       // and a waiting queue
  config.enable_prefix_cache = false;
  engine::Engine engine(*model_, config);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Pending>> requests;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(random_tokens(5 + 7 * i % 41, 97, 100 + i));
    requests.push_back(std::make_unique<Pending>(engine, greedy_request(prompts.back(), 6 + i % 5)));
  }
  for (int i = 0; i < 16; ++i) EXPECT_EQ(requests[i]->get().tokens, alone(prompts[i], 6 + i % 5)) << "request " << i;
  expect_idle(engine);
}

// Sampled requests side by side: each draws the tokens engine::generate draws alone with the
// same seed (the engine hands plainly sampled rows to the runner with the sequence's next uniform
// value; a request with a penalty comes back whole and draws in the engine).
TEST_F(EngineTest, SeededSampledRequestsMatchTheGenerator) {
  engine::EngineConfig config;
  config.max_batch_tokens = 32;
  engine::Engine engine(*model_, config);
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const std::vector<Case> cases = {{0.8f, 0, 1.0f, 0.0f}, {1.2f, 20, 1.0f, 0.0f}, {0.9f, 0, 0.8f, 0.0f},
                                   {1.0f, 30, 0.9f, 0.05f}, {1.5f, 0, 1.0f, 0.1f}};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<engine::RequestParams> requests;
  std::vector<std::unique_ptr<Pending>> pending;
  for (size_t i = 0; i < cases.size(); ++i) {
    prompts.push_back(random_tokens(9 + 5 * static_cast<int>(i), 97, 300 + i));
    engine::RequestParams params = greedy_request(prompts.back(), 14);
    params.sampling = {cases[i].temperature, cases[i].top_p, cases[i].top_k, cases[i].min_p, 40 + i};
    requests.push_back(params);
    pending.push_back(std::make_unique<Pending>(engine, params));
  }
  engine::RequestParams penalised = requests[0];
  penalised.presence_penalty = 0.5f;  // drawn in the engine from the whole row
  Pending penalised_request(engine, penalised);
  for (size_t i = 0; i < cases.size(); ++i) {
    engine::GenerateOptions options;
    options.max_tokens = 14;
    options.sampling = requests[i].sampling;
    options.ignore_eos = true;
    EXPECT_EQ(pending[i]->get().tokens, engine::generate(*model_, prompts[i], options).output_ids) << "request " << i;
  }
  EXPECT_EQ(penalised_request.get().tokens.size(), 14u);
  expect_idle(engine);
}

TEST_F(EngineTest, SharedPrefixIsServedFromTheCache) {
  engine::EngineConfig config;
  config.block_size = 8;
  engine::Engine engine(*model_, config);
  const auto prefix = random_tokens(40, 97, 5);
  auto first = prefix, second = prefix;
  first.push_back(11);
  second.push_back(12);
  second.push_back(13);
  const Collected a = Pending(engine, greedy_request(first, 5)).get();
  const Collected b = Pending(engine, greedy_request(second, 5)).get();
  EXPECT_EQ(a.last.cached_prompt_tokens, 0);
  EXPECT_EQ(b.last.cached_prompt_tokens, 40);  // five full blocks of 8
  EXPECT_EQ(b.tokens, alone(second, 5));
  const engine::EngineStats stats = engine.stats();
  EXPECT_GE(stats.prefix_cache_hits, 40);
  EXPECT_GT(stats.num_cached_blocks, 0);
  expect_idle(engine);
}

// vLLM's reset_prefix_cache: refused while a request is in flight (asked from its first output,
// on the engine's thread); when idle it frees every cached block, and the same prompt then finds
// nothing cached and still gives the same tokens.
TEST_F(EngineTest, ResetPrefixCacheEmptiesItWhenIdle) {
  engine::EngineConfig config;
  config.block_size = 8;
  engine::Engine engine(*model_, config);
  auto prompt = random_tokens(40, 97, 13);
  prompt.push_back(11);
  const Collected first = Pending(engine, greedy_request(prompt, 4)).get();
  const int cached = engine.stats().num_cached_blocks;
  ASSERT_GE(cached, 5);

  std::promise<std::optional<int>> during;
  bool asked = false;
  std::promise<void> done;
  engine.submit(greedy_request(random_tokens(20, 97, 14), 6), [&](const engine::RequestOutput& out) {
    if (!asked) {
      asked = true;
      during.set_value(engine.reset_prefix_cache());
    }
    if (out.finished) done.set_value();
  });
  EXPECT_EQ(during.get_future().get(), std::nullopt) << "a request was running";
  done.get_future().wait();
  EXPECT_GE(engine.stats().num_cached_blocks, cached) << "nothing was freed while it ran";

  const std::optional<int> freed = engine.reset_prefix_cache();
  ASSERT_TRUE(freed.has_value());
  EXPECT_GE(*freed, cached);
  EXPECT_EQ(engine.stats().num_cached_blocks, 0);
  const Collected again = Pending(engine, greedy_request(prompt, 4)).get();
  EXPECT_EQ(again.last.cached_prompt_tokens, 0);
  EXPECT_EQ(again.tokens, first.tokens);
  expect_idle(engine);
}

// A request's cache_salt: its prefix serves only requests with the same salt, and its tokens are
// the same as without a cache.
TEST_F(EngineTest, ACacheSaltSharesThePrefixOnlyWithinTheSalt) {
  engine::EngineConfig config;
  config.block_size = 8;
  engine::Engine engine(*model_, config);
  auto prompt = random_tokens(40, 97, 9);
  prompt.push_back(11);
  auto salted = [&](const std::string& salt) {
    engine::RequestParams params = greedy_request(prompt, 4);
    params.cache_salt = salt;
    return Pending(engine, params).get();
  };
  EXPECT_EQ(salted("tenant-a").last.cached_prompt_tokens, 0);
  const Collected other = salted("tenant-b");
  EXPECT_EQ(other.last.cached_prompt_tokens, 0);  // the same prompt, another tenant's salt
  EXPECT_EQ(Pending(engine, greedy_request(prompt, 4)).get().last.cached_prompt_tokens, 0);  // and no salt
  const Collected same = salted("tenant-a");
  EXPECT_EQ(same.last.cached_prompt_tokens, 40);
  EXPECT_EQ(same.tokens, other.tokens);
  EXPECT_EQ(same.tokens, alone(prompt, 4));
  expect_idle(engine);
}

TEST_F(EngineTest, PreemptionUnderMemoryPressureKeepsOutputsExact) {
  engine::EngineConfig config;
  config.block_size = 4;
  config.max_model_len = 64;
  const int64_t bytes_per_block = model_->cache_layout(4).bytes_per_token() * 4;
  config.kv_cache_bytes = bytes_per_block * 24;  // 96 tokens for 8 requests of up to 50
  config.max_num_seqs = 8;
  engine::Engine engine(*model_, config);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Pending>> requests;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_tokens(10 + 3 * i, 97, 300 + i));
    requests.push_back(std::make_unique<Pending>(engine, greedy_request(prompts.back(), 16)));
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(requests[i]->get().tokens, alone(prompts[i], 16)) << "request " << i;
  EXPECT_GT(engine.stats().num_preemptions, 0);
  expect_idle(engine);
}

TEST_F(EngineTest, CancelFreesBlocksAndReportsAbort) {
  engine::Engine engine(*model_, {});
  // The callback itself cancels (as the server does on a stop string): it must not deadlock.
  const engine::RequestOutput out =
      glms::testing::cancel_from_callback(engine, greedy_request(random_tokens(30, 97, 9), 2000), 1);
  EXPECT_EQ(out.finish_reason, "abort");
  EXPECT_LT(out.completion_tokens, 2000);
  expect_idle(engine);
}

TEST_F(EngineTest, StopsAtStopTokensAndTimeout) {
  engine::Engine engine(*model_, {});
  const auto prompt = random_tokens(12, 97, 4);
  const auto expected = alone(prompt, 8);
  engine::RequestParams stop = greedy_request(prompt, 8);
  stop.stop_token_ids = {expected[3]};
  const Collected stopped = Pending(engine, stop).get();
  EXPECT_EQ(stopped.last.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens.back(), expected[3]);
  EXPECT_LE(stopped.tokens.size(), 4u);

  engine::RequestParams timed = greedy_request(prompt, 3000);
  timed.timeout_seconds = 0.05;
  const Collected timeout = Pending(engine, timed).get();
  EXPECT_EQ(timeout.last.finish_reason, "timeout");
  expect_idle(engine);
}

TEST(EngineEos, StopsAtTheModelsEosUnlessIgnored) {
  // The same weights twice: once with EOS ids the greedy run never produces, once with its
  // fourth token as EOS.
  glms::testing::TempDir dir("engine-eos");
  glms::testing::RandomModelSpec spec;
  const model::Glm5Model plain(model::load_weights(glms::testing::write_random_model(dir.path / "a", spec).string()));
  const auto prompt = random_tokens(15, 97, 8);
  engine::Engine first(plain, {});
  const Collected reference = Pending(first, greedy_request(prompt, 8)).get();
  ASSERT_EQ(reference.tokens.size(), 8u);
  spec.eos_token_ids = {reference.tokens[3]};
  const model::Glm5Model with_eos(model::load_weights(glms::testing::write_random_model(dir.path / "b", spec).string()));
  engine::Engine second(with_eos, {});
  engine::RequestParams params = greedy_request(prompt, 8);
  params.ignore_eos = false;
  const Collected stopped = Pending(second, params).get();
  EXPECT_EQ(stopped.last.finish_reason, "stop");
  const size_t first_eos = std::find(reference.tokens.begin(), reference.tokens.end(), reference.tokens[3]) -
                           reference.tokens.begin();
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(reference.tokens.begin(), reference.tokens.begin() + first_eos + 1));
  params.ignore_eos = true;
  EXPECT_EQ(Pending(second, params).get().tokens, reference.tokens);
}

TEST_F(EngineTest, DrainWithADeadlineEndsWhatIsLeftWithAnError) {
  engine::Engine engine(*model_, {});
  Pending long_request(engine, greedy_request(random_tokens(10, 97, 3), 3000));
  EXPECT_FALSE(engine.drain(0.05));
  const Collected ended = long_request.get();
  EXPECT_EQ(ended.last.finish_reason, "error");
  EXPECT_NE(ended.last.error.find("shut down"), std::string::npos) << ended.last.error;
  expect_idle(engine);
}

TEST_F(EngineTest, RejectsInvalidRequestsAndAFullQueue) {
  engine::EngineConfig config;
  config.max_model_len = 50;
  config.max_waiting = 2;
  engine::Engine engine(*model_, config);
  EXPECT_THROW(engine.submit(greedy_request({}, 4), nullptr), Error);
  EXPECT_THROW(engine.submit(greedy_request({5, 97}, 4), nullptr), Error);
  EXPECT_THROW(engine.submit(greedy_request(random_tokens(40, 97, 1), 11), nullptr), Error);
  EXPECT_THROW(engine.submit(greedy_request({5}, 0), nullptr), Error);
  // A queue of two: the third concurrent submission is refused while the first two wait.
  std::vector<std::unique_ptr<Pending>> requests;
  bool refused = false;
  for (int i = 0; i < 50 && !refused; ++i) {
    try {
      requests.push_back(std::make_unique<Pending>(engine, greedy_request(random_tokens(30, 97, i), 20)));
    } catch (const engine::QueueFull&) {
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  for (auto& r : requests) r->get();
  expect_idle(engine);
}

TEST_F(EngineTest, DrainFinishesInFlightRequests) {
  auto engine = std::make_unique<engine::Engine>(*model_, engine::EngineConfig{});
  Pending a(*engine, greedy_request(random_tokens(20, 97, 1), 10)), b(*engine, greedy_request(random_tokens(9, 97, 2), 10));
  engine->drain();
  EXPECT_EQ(a.get().last.finish_reason, "length");
  EXPECT_EQ(b.get().last.finish_reason, "length");
  EXPECT_THROW(engine->submit(greedy_request({5}, 2), nullptr), Error);
}

TEST_F(EngineTest, LogitBiasAndMinTokensShapeTheDraws) {
  engine::Engine engine(*model_, {});
  const auto prompt = random_tokens(12, 97, 5);
  const auto expected = alone(prompt, 6);
  // A large bias makes its token the greedy pick at every step; a small one moves nothing.
  engine::RequestParams biased = greedy_request(prompt, 6);
  const int32_t favourite = (expected[0] + 7) % 97;
  biased.logit_bias = {{favourite, 100.0f}};
  EXPECT_EQ(Pending(engine, biased).get().tokens, std::vector<int32_t>(6, favourite));
  biased.logit_bias = {{favourite, 1e-6f}};
  EXPECT_EQ(Pending(engine, biased).get().tokens, expected);
  // A stop id the greedy run emits first: without min_tokens the request ends there, with it the
  // id is held back for min_tokens tokens (the other draws follow the adjusted logits).
  engine::RequestParams stop = greedy_request(prompt, 6);
  stop.stop_token_ids = {expected[0]};
  const Collected stopped = Pending(engine, stop).get();
  EXPECT_EQ(stopped.tokens.size(), 1u);
  EXPECT_EQ(stopped.last.finish_reason, "stop");
  stop.min_tokens = 4;
  const Collected held = Pending(engine, stop).get();
  ASSERT_GE(held.tokens.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_NE(held.tokens[i], expected[0]) << "token " << i;
  expect_idle(engine);
}

// Prompt logprobs: each prompt token's logprob, rank and top-k equal a one-shot forward over the
// whole prompt (log-softmax of the row before it), whether the prompt is prefilled in one chunk
// or in many (rows kept within the step's logits rows), after its prefix is cached by another
// request (it skips the cache), and beside a concurrent request whose tokens do not change.
TEST_F(EngineTest, PromptLogprobsEqualAOneShotForward) {
  const std::vector<int32_t> prompt = random_tokens(70, 97, 41);
  // The reference: every position's logits in one step.
  const int block_size = 16, blocks = 8;
  kv::PagedLatentCache cache(model_->cache_layout(block_size), blocks);
  model::ForwardBatch batch;
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = b;
  batch.add_sequence(prompt, 0, table, block_size, true);
  const std::vector<float> rows = model_->forward(batch, cache);
  const int vocab = model_->config().vocab_size;
  for (const int max_batch_tokens : {2048, 24}) {
    engine::EngineConfig config;
    config.max_batch_tokens = max_batch_tokens;
    config.max_num_seqs = 4;  // 4 logits rows per step: the 70-token prompt takes many steps
    engine::Engine engine(*model_, config);
    Pending warm(engine, greedy_request(prompt, 2));  // puts the prompt's blocks in the prefix cache
    warm.get();
    std::promise<std::vector<engine::GeneratedToken>> scored;
    std::promise<void> finished;
    engine::RequestParams p = greedy_request(prompt, 3);
    p.prompt_logprobs = 2;
    bool first = true;
    engine.submit(p, [&](const engine::RequestOutput& out) {
      if (first) scored.set_value(out.prompt_logprobs);
      first = false;
      if (out.finished) finished.set_value();
    });
    Pending beside(engine, greedy_request(random_tokens(20, 97, 5), 8));
    const std::vector<engine::GeneratedToken> got = scored.get_future().get();
    EXPECT_EQ(beside.get().tokens, alone(random_tokens(20, 97, 5), 8));
    ASSERT_EQ(got.size(), prompt.size() - 1) << "max_batch_tokens " << max_batch_tokens;
    for (size_t i = 0; i < got.size(); ++i) {
      const float* row = rows.data() + i * vocab;  // the row at position i scores token i + 1
      double total = 0;
      const float top = *std::max_element(row, row + vocab);
      for (int t = 0; t < vocab; ++t) total += std::exp(double(row[t] - top));
      const double want = row[prompt[i + 1]] - top - std::log(total);
      EXPECT_EQ(got[i].token, prompt[i + 1]);
      EXPECT_NEAR(got[i].logprob, want, 1e-3) << "position " << i + 1;
      EXPECT_EQ(got[i].rank, 1 + std::count_if(row, row + vocab, [&](float l) { return l > row[prompt[i + 1]]; }));
      ASSERT_EQ(got[i].top_logprobs.size(), 2u);
      EXPECT_EQ(got[i].top_logprobs[0].token, std::max_element(row, row + vocab) - row);
    }
    finished.get_future().wait();
    expect_idle(engine);
  }
}

// --kv-cache-dtype reaches the cache through the engine and the generator alike: with an FP8
// cache both give the same greedy tokens, and these are not the fp32 cache's (this model's
// top-12 selection over near-tied random scores moves with rounded indexer keys).
TEST_F(EngineTest, AnFp8CacheGivesTheGeneratorsFp8Tokens) {
  const auto prompt = random_tokens(60, 97, 7);
  engine::GenerateOptions options;
  options.max_tokens = 24;
  options.sampling.temperature = 0.0f;
  options.ignore_eos = true;
  options.kv_cache_dtype = kv::CacheDtype::kFp8E4m3;
  const auto fp8_alone = engine::generate(*model_, prompt, options).output_ids;
  engine::EngineConfig config;
  config.kv_cache_dtype = kv::CacheDtype::kFp8E4m3;
  engine::Engine engine(*model_, config);
  EXPECT_EQ(Pending(engine, greedy_request(prompt, 24)).get().tokens, fp8_alone);
  EXPECT_NE(fp8_alone, alone(prompt, 24));
  expect_idle(engine);
}

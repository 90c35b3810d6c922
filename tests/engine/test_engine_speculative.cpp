// The serving engine with MTP speculation: concurrent greedy requests (prefill chunks beside
// speculative decodes, max_tokens and stop ids landing inside accepted drafts, a request with
// penalties decoding plainly, the prefix cache) give exactly the tokens the engine gives
// without speculation, the counters account every draft, and every block comes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "pending_request.h"

using namespace glms;
using glms::testing::Collected;
using glms::testing::Pending;
using glms::testing::greedy_request;

namespace {

const std::string kModel = std::string(GLMS_SOURCE_DIR) + "/models/glm5-tiny-code";

std::vector<int32_t> prompt_ids(size_t offset, size_t length) {
  const io::Checkpoint golden = io::Checkpoint::open(kModel + "/golden.safetensors");
  const auto ids = io::read_i64(golden.get("prompt_ids"));
  offset %= ids.size() - length;
  return std::vector<int32_t>(ids.begin() + offset, ids.begin() + offset + length);
}

// The requests, submitted together so that prefills, plain and speculative decodes share steps.
std::vector<Collected> run_all(engine::Engine& engine, const std::vector<engine::RequestParams>& requests) {
  std::vector<std::unique_ptr<Pending>> pending;
  for (const auto& r : requests) pending.push_back(std::make_unique<Pending>(engine, r));
  std::vector<Collected> out;
  for (auto& p : pending) out.push_back(p->get());
  return out;
}

void expect_idle(engine::Engine& engine) {
  const engine::EngineStats stats = engine.stats();
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_free_blocks, stats.num_blocks) << "a block leaked";
}

}  // namespace

TEST(EngineSpeculative, GreedyRequestsMatchTheEngineWithoutSpeculation) {
  const model::Glm5Model model(model::load_weights(kModel));
  engine::EngineConfig plain_config;
  plain_config.max_batch_tokens = 64;  // long prompts prefill in chunks beside the decodes
  engine::EngineConfig spec_config = plain_config;
  spec_config.speculative_steps = 3;
  engine::Engine probe(model, plain_config), plain(model, plain_config), spec(model, spec_config);

  std::vector<engine::RequestParams> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(greedy_request(prompt_ids(37 * i, 20 + 23 * i), 24 + 5 * i));
  requests.push_back(greedy_request(prompt_ids(5, 30), 2));   // max_tokens inside the first drafts
  requests.push_back(greedy_request(prompt_ids(5, 30), 24));  // the same prompt: a prefix-cache hit
  requests.back().prompt_ids.push_back(requests.back().prompt_ids[3]);
  engine::RequestParams penalised = greedy_request(prompt_ids(90, 40), 20);
  penalised.repetition_penalty = 1.3f;  // decodes plainly beside the speculative ones
  requests.push_back(penalised);
  // Stop ids taken from plain outputs, so that the stops land inside accepted drafts.
  const auto probed = run_all(probe, std::vector(requests.begin(), requests.begin() + 3));
  for (int i = 0; i < 3; ++i) requests[i].stop_token_ids = {probed[i].tokens[9 + i]};
  const auto expected = run_all(plain, requests);
  const auto got = run_all(spec, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected& want = expected[i];
    EXPECT_EQ(got[i].tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got[i].last.finish_reason, want.last.finish_reason) << "request " << i;
    EXPECT_EQ(got[i].last.completion_tokens, static_cast<int>(want.tokens.size())) << "request " << i;
  }

  const engine::EngineStats stats = spec.stats();
  EXPECT_GT(stats.spec_draft_tokens, 0);
  EXPECT_GT(stats.spec_accepted_tokens, 0) << "the trained MTP layer's drafts are often right";
  EXPECT_LE(stats.spec_accepted_tokens, stats.spec_draft_tokens);
  EXPECT_LE(stats.spec_drafts, stats.spec_draft_tokens) << "at least one draft per verification";
  EXPECT_GE(stats.spec_drafts * 3, stats.spec_draft_tokens) << "at most K = 3 drafts per verification";
  ASSERT_EQ(stats.spec_accepted_per_position.size(), 3u);
  EXPECT_EQ(stats.spec_accepted_per_position[0] + stats.spec_accepted_per_position[1] +
                stats.spec_accepted_per_position[2],
            stats.spec_accepted_tokens);
  EXPECT_GE(stats.spec_accepted_per_position[0], stats.spec_accepted_per_position[1]);
  EXPECT_LT(stats.steps, plain.stats().steps) << "speculation takes fewer steps";
  std::printf("[ spec     ] engine K=3: %lld drafts, %lld accepted (%lld/%lld/%lld by position), %lld steps vs %lld\n",
              static_cast<long long>(stats.spec_draft_tokens), static_cast<long long>(stats.spec_accepted_tokens),
              static_cast<long long>(stats.spec_accepted_per_position[0]),
              static_cast<long long>(stats.spec_accepted_per_position[1]),
              static_cast<long long>(stats.spec_accepted_per_position[2]), static_cast<long long>(stats.steps),
              static_cast<long long>(plain.stats().steps));
  expect_idle(spec);
}

// A tiny token budget: prefill chunks of 16 tokens, and entries that queue up while a sequence
// waits run in pieces of at most the budget.
TEST(EngineSpeculative, SmallBudgetsStillMatch) {
  const model::Glm5Model model(model::load_weights(kModel));
  engine::EngineConfig config;
  config.max_batch_tokens = 16;
  config.max_num_seqs = 3;
  engine::EngineConfig spec_config = config;
  spec_config.speculative_steps = 4;
  engine::Engine plain(model, config), spec(model, spec_config);
  std::vector<engine::RequestParams> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(greedy_request(prompt_ids(61 * i, 35 + 9 * i), 20));
  const auto expected = run_all(plain, requests);
  const auto got = run_all(spec, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
  EXPECT_GT(spec.stats().spec_accepted_tokens, 0);
  expect_idle(spec);
}

// speculative_max_batch: while more sequences decode than the limit, they decode plainly; as
// requests finish, the rest draft again from the MTP entries kept up to date meanwhile.
TEST(EngineSpeculative, LargeBatchesDecodePlainly) {
  const model::Glm5Model model(model::load_weights(kModel));
  engine::EngineConfig config;
  config.max_batch_tokens = 64;
  engine::EngineConfig unlimited = config, limited = config;
  unlimited.speculative_steps = limited.speculative_steps = 3;
  unlimited.speculative_max_batch = 0;
  limited.speculative_max_batch = 2;
  engine::Engine plain(model, config), spec_unlimited(model, unlimited), spec_limited(model, limited);
  std::vector<engine::RequestParams> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(greedy_request(prompt_ids(97 * i, 20 + 5 * i), 12 + 12 * i));
  const auto expected = run_all(plain, requests);
  const auto got_unlimited = run_all(spec_unlimited, requests);
  const auto got_limited = run_all(spec_limited, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got_unlimited[i].tokens, expected[i].tokens) << "request " << i;
    EXPECT_EQ(got_limited[i].tokens, expected[i].tokens) << "request " << i;
  }
  const engine::EngineStats limited_stats = spec_limited.stats(), unlimited_stats = spec_unlimited.stats();
  EXPECT_GT(limited_stats.spec_drafts, 0) << "the last two requests speculate";
  EXPECT_GT(limited_stats.spec_accepted_tokens, 0) << "drafts after a plain stretch are still good";
  EXPECT_LT(limited_stats.spec_drafts, unlimited_stats.spec_drafts);
  EXPECT_LT(unlimited_stats.steps, limited_stats.steps);
  EXPECT_LT(limited_stats.steps, plain.stats().steps);
  expect_idle(spec_limited);
}

TEST(EngineSpeculative, SampledRequestsAreSeededAndComplete) {
  const model::Glm5Model model(model::load_weights(kModel));
  engine::EngineConfig config;
  config.speculative_steps = 2;
  engine::Engine engine(model, config);
  engine::RequestParams sampled = greedy_request(prompt_ids(11, 50), 30);
  sampled.sampling.temperature = 0.7f;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 5;
  sampled.top_logprobs = 2;
  const auto first = run_all(engine, {sampled, sampled});
  EXPECT_EQ(first[0].tokens, first[1].tokens) << "same seed, same tokens";
  EXPECT_EQ(first[0].tokens.size(), 30u);
  EXPECT_EQ(first[0].last.finish_reason, "length");
  expect_idle(engine);
}

// A draft layer that fails: the requests in flight end with "error" and the engine carries on.
TEST(EngineSpeculative, AFailingDraftLayerEndsRequestsNotTheEngine) {
  const model::Glm5Model model(model::load_weights(kModel));
  class FailingDrafts : public model::StepRunner {
   public:
    explicit FailingDrafts(const model::Glm5Model& m) : inner_(model::make_cpu_runner(m)) {}
    const io::ModelConfig& config() const override { return inner_->config(); }
    std::string device() const override { return "cpu"; }
    int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
      return inner_->cache_bytes_per_token(dtype, mtp);
    }
    void allocate(const model::CacheShape& shape) override { inner_->allocate(shape); }
    int num_blocks() const override { return inner_->num_blocks(); }
    void limit_blocks(int blocks) override { inner_->limit_blocks(blocks); }
    std::vector<float> forward(const model::ForwardBatch& batch, model::ForwardTrace* trace) override {
      return inner_->forward(batch, trace);
    }
    bool has_mtp() const override { return true; }
    std::vector<float> mtp_forward(const model::ForwardBatch&, const float*, std::vector<float>*) override {
      fail("draft layer failure (test)");
    }

   private:
    std::unique_ptr<model::StepRunner> inner_;
  };
  engine::EngineConfig config;
  config.speculative_steps = 2;
  engine::Engine engine(std::make_unique<FailingDrafts>(model), config);
  for (int round = 0; round < 2; ++round) {
    const Collected result = Pending(engine, greedy_request(prompt_ids(3, 20), 8)).get();
    EXPECT_EQ(result.last.finish_reason, "error");
    EXPECT_NE(result.last.error.find("draft layer failure"), std::string::npos) << result.last.error;
  }
  expect_idle(engine);
}

// Cancelling from the output callback (as the server does on a stop string) and timeouts end
// speculating requests like plain ones, with every block back.
TEST(EngineSpeculative, CancelAndTimeoutFreeEverything) {
  const model::Glm5Model model(model::load_weights(kModel));
  engine::EngineConfig config;
  config.speculative_steps = 3;
  engine::Engine engine(model, config);
  const engine::RequestOutput out = glms::testing::cancel_from_callback(engine, greedy_request(prompt_ids(7, 40), 3000), 5);
  EXPECT_EQ(out.finish_reason, "abort");
  EXPECT_LT(out.completion_tokens, 3000);
  engine::RequestParams timed = greedy_request(prompt_ids(9, 40), 3000);
  timed.timeout_seconds = 0.05;
  EXPECT_EQ(Pending(engine, timed).get().last.finish_reason, "timeout");
  expect_idle(engine);
}

TEST(EngineSpeculative, NeedsAnMtpLayer) {
  const model::Glm5Model model(model::load_weights(std::string(GLMS_SOURCE_DIR) + "/tests/golden/glm5-random"));
  engine::EngineConfig config;
  config.speculative_steps = 2;
  EXPECT_THROW(engine::Engine(model, config), Error);
}

// --kv-cache-memory is the whole cache: with speculation it holds the MTP layer's rows too (the
// CPU runner keeps them in a second cache of as many blocks), so the blocks it buys are fewer.
TEST(EngineSpeculative, TheCacheBudgetHoldsTheDraftLayersRowsToo) {
  const model::Glm5Model model(model::load_weights(kModel));
  const auto probe = model::make_cpu_runner(model);
  const int64_t plain = probe->cache_bytes_per_token(kv::CacheDtype::kAuto, false);
  const int64_t with_drafts = probe->cache_bytes_per_token(kv::CacheDtype::kAuto, true);
  EXPECT_EQ(with_drafts, plain + model.mtp_cache_layout(1).bytes_per_token());
  engine::EngineConfig config;
  config.speculative_steps = 2;
  config.max_model_len = 256;
  config.kv_cache_bytes = int64_t{8} << 20;
  auto runner = model::make_cpu_runner(model);
  const model::StepRunner* cpu = runner.get();
  engine::Engine engine(std::move(runner), config);
  EXPECT_LE(cpu->cache_bytes(), config.kv_cache_bytes);
  EXPECT_GT(cpu->cache_bytes(), config.kv_cache_bytes - with_drafts * config.block_size);
  const Collected result = Pending(engine, greedy_request(prompt_ids(3, 20), 8)).get();
  EXPECT_EQ(result.tokens.size(), 8u);
}

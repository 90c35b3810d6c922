// Structured-output masks where the logits are: on a device runner the engine sends a
// constrained row's token mask with the row (RowOutput::mask) and gets back only its token; on
// the CPU, and for requests that need their logits for more (logit_bias here), the whole row
// comes back and is masked on the host. Both routes must draw the same tokens. The device route
// runs here on the CPU runner dressed as a device (its forward_selected applies the masks on
// the host, select_logits), so this is the engine's half; tests/engine/test_cuda_engine.cpp
// runs the same over the CUDA runner's kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/glm5.h"
#include "pending_request.h"
#include "random_model.h"
#include "runtime/executor.h"
#include "strided_constraint.h"

using namespace glms;
using glms::testing::Pending;
using glms::testing::StridedConstraint;

namespace {

// The CPU runner under another device name, counting the rows its steps asked for: masked ones
// and whole ones.
class CountingExecutor : public runtime::Executor {
 public:
  CountingExecutor(const model::Glm5Model& model, std::string device)
      : inner_(runtime::make_local_executor(model::make_cpu_runner(model))), device_(std::move(device)) {}
  const io::ModelConfig& config() const override { return inner_->config(); }
  const runtime::ParallelLayout& layout() const override { return inner_->layout(); }
  std::string device() const override { return device_; }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    return inner_->cache_bytes_per_token(dtype, mtp);
  }
  void allocate(const model::CacheShape& shape) override { inner_->allocate(shape); }
  int num_blocks() const override { return inner_->num_blocks(); }
  std::vector<RankMemory> memory() const override { return inner_->memory(); }
  bool has_mtp() const override { return inner_->has_mtp(); }
  std::vector<runtime::RankResult> forward(std::vector<runtime::RankStep>& steps, bool want_hidden) override {
    for (const runtime::RankStep& step : steps)
      for (const model::RowOutput& o : step.outputs) {
        masked_rows += o.has_mask();
        whole_rows += o.kind == model::RowOutput::Kind::kLogits;
      }
    return inner_->forward(steps, want_hidden);
  }
  std::vector<runtime::RankResult> mtp_forward(std::vector<runtime::RankStep>& steps) override {
    return inner_->mtp_forward(steps);
  }
  std::atomic<int> masked_rows{0}, whole_rows{0};

 private:
  std::unique_ptr<runtime::Executor> inner_;
  std::string device_;
};

class EngineMasks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new glms::testing::TempDir("engine-masks");
    model_ = new model::Glm5Model(
        model::load_weights(glms::testing::write_random_model(dir_->path / "m", {}).string()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static glms::testing::TempDir* dir_;
  static model::Glm5Model* model_;
};
glms::testing::TempDir* EngineMasks::dir_ = nullptr;
model::Glm5Model* EngineMasks::model_ = nullptr;

struct Constrained {
  std::vector<int32_t> tokens;
  int violations = 0;
  std::string finish_reason;
};

// The requests of `kinds` (0: greedy ignoring EOS, 1: greedy that may end, 2: sampled, 3: greedy
// with a logit_bias too), submitted together, each under its own constraint.
std::vector<Constrained> run_constrained(engine::Engine& engine, const std::vector<int>& kinds) {
  const io::ModelConfig& mc = engine.model_config();
  std::vector<std::shared_ptr<StridedConstraint>> constraints;
  std::vector<std::unique_ptr<Pending>> pending;
  for (size_t i = 0; i < kinds.size(); ++i) {
    engine::RequestParams params =
        glms::testing::greedy_request(glms::testing::prompt_tokens(5 + 7 * static_cast<int>(i), mc.vocab_size, 60 + i), 12);
    params.ignore_eos = kinds[i] != 1;
    if (kinds[i] == 2) params.sampling = {0.9f, 0.95f, 0, 0.0f, 70 + i};
    if (kinds[i] == 3) params.logit_bias = {{10, 2.0f}, {45, -1.0f}};
    const std::vector<int32_t> eos = params.ignore_eos ? std::vector<int32_t>{} : mc.eos_token_ids;
    constraints.push_back(std::make_shared<StridedConstraint>(4 + static_cast<int>(i % 3), 3, eos));
    params.constraint = constraints.back();
    pending.push_back(std::make_unique<Pending>(engine, params));
  }
  std::vector<Constrained> out;
  for (size_t i = 0; i < pending.size(); ++i) {
    const glms::testing::Collected c = pending[i]->get();
    out.push_back({c.tokens, constraints[i]->violations(), c.last.finish_reason});
  }
  return out;
}

engine::EngineConfig small_config() {
  engine::EngineConfig config;
  config.max_batch_tokens = 24;  // chunked prefills beside decodes
  config.kv_cache_bytes = int64_t{16} << 20;
  return config;
}

}  // namespace

TEST_F(EngineMasks, DeviceMasksDrawTheHostsTokens) {
  auto host_executor = std::make_unique<CountingExecutor>(*model_, "cpu");
  auto device_executor = std::make_unique<CountingExecutor>(*model_, "test-device");
  CountingExecutor& host_counts = *host_executor;
  CountingExecutor& device_counts = *device_executor;
  engine::Engine host(std::move(host_executor), small_config());
  engine::Engine device(std::move(device_executor), small_config());
  EXPECT_FALSE(host.config().device_token_masks) << "the CPU masks on the host";
  EXPECT_TRUE(device.config().device_token_masks);

  const std::vector<int> kinds = {0, 1, 2, 0, 2, 1};
  const auto expected = run_constrained(host, kinds);
  const auto got = run_constrained(device, kinds);
  for (size_t i = 0; i < kinds.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + " kind " + std::to_string(kinds[i]));
    EXPECT_EQ(got[i].tokens, expected[i].tokens);
    EXPECT_EQ(got[i].finish_reason, expected[i].finish_reason);
    EXPECT_EQ(expected[i].violations, 0);
    EXPECT_EQ(got[i].violations, 0);
    EXPECT_FALSE(got[i].tokens.empty());
  }
  EXPECT_EQ(host_counts.masked_rows, 0);
  EXPECT_GT(host_counts.whole_rows, 0);
  EXPECT_GT(device_counts.masked_rows, 0);
  EXPECT_EQ(device_counts.whole_rows, 0) << "a constrained row with nothing else came back whole";
}

// A constrained request that also needs its logits on the host (logit_bias) goes the host route
// on a device runner too, and draws the CPU's tokens.
TEST_F(EngineMasks, RequestsThatNeedTheirLogitsStillComeBackWhole) {
  auto device_executor = std::make_unique<CountingExecutor>(*model_, "test-device");
  CountingExecutor& device_counts = *device_executor;
  engine::Engine host(*model_, small_config());
  engine::Engine device(std::move(device_executor), small_config());
  const std::vector<int> kinds = {3, 3};
  const auto expected = run_constrained(host, kinds);
  const auto got = run_constrained(device, kinds);
  for (size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].violations, 0);
  }
  EXPECT_EQ(device_counts.masked_rows, 0);
  EXPECT_GT(device_counts.whole_rows, 0);
}

// A row's mask applies before every kind of output the default forward_selected makes: argmax,
// draw and whole row.
TEST(SelectLogits, AppliesEachRowsMaskFirst) {
  const int vocab = 37;
  std::vector<float> logits(3 * vocab);
  for (int i = 0; i < 3 * vocab; ++i) logits[i] = static_cast<float>((i * 13) % 29) - 10.0f;
  auto only = [&](std::vector<int> allowed) {
    auto words = std::make_shared<std::vector<uint32_t>>(engine::TokenConstraint::mask_words(vocab), 0u);
    for (int t : allowed) (*words)[t / 32] |= uint32_t{1} << (t % 32);
    return words;
  };
  std::vector<model::RowOutput> outputs(3);
  outputs[0].mask = only({4, 33});
  outputs[1].kind = model::RowOutput::Kind::kSample;
  outputs[1].temperature = 1.0f;
  outputs[1].canonical = 0.999;
  outputs[1].mask = only({36});  // one allowed token, the last of a vocabulary not a multiple of 32
  outputs[2].kind = model::RowOutput::Kind::kLogits;
  outputs[2].mask = only({0, 1, 2});
  const model::StepLogits out = model::select_logits(logits.data(), vocab, outputs);
  EXPECT_EQ(out.token[0], logits[4] >= logits[33] ? 4 : 33);
  EXPECT_EQ(out.token[1], 36);
  const float* row = out.row(2);
  ASSERT_NE(row, nullptr);
  for (int t = 0; t < vocab; ++t) {
    if (t < 3) EXPECT_EQ(row[t], logits[2 * vocab + t]);
    else EXPECT_EQ(row[t], -std::numeric_limits<float>::infinity()) << t;
  }
  EXPECT_LT(out.token[2], 3);
}

// A mask made on demand (RowOutput::mask_source) selects what the same mask given up front does,
// and is made once.
TEST(SelectLogits, AMaskMadeOnDemandActsAsTheSameMask) {
  const int vocab = 70;
  std::vector<float> logits(2 * vocab);
  for (int i = 0; i < 2 * vocab; ++i) logits[i] = static_cast<float>((i * 17) % 31) - 12.0f;
  auto words = std::make_shared<std::vector<uint32_t>>(engine::TokenConstraint::mask_words(vocab), 0u);
  for (int t : {3, 40, 69}) (*words)[t / 32] |= uint32_t{1} << (t % 32);
  std::vector<model::RowOutput> given(2), made(2);
  int calls = 0;
  for (int i = 0; i < 2; ++i) {
    given[i].kind = made[i].kind = i == 0 ? model::RowOutput::Kind::kArgmax : model::RowOutput::Kind::kLogits;
    given[i].mask = words;
    made[i].mask_source_words = static_cast<int32_t>(words->size());
    made[i].mask_source = [words, &calls](uint32_t* out) {
      ++calls;
      std::copy(words->begin(), words->end(), out);
    };
  }
  const model::StepLogits want = model::select_logits(logits.data(), vocab, given);
  const model::StepLogits got = model::select_logits(logits.data(), vocab, made);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(got.token, want.token);
  EXPECT_EQ(got.full, want.full);
  EXPECT_TRUE(made[0].has_mask());
  EXPECT_FALSE(model::RowOutput{}.has_mask());
}

namespace {

// The strided constraint that gives up after `tokens` accepted tokens (as a grammar past its
// work bound does: structured::kMaxRequestGrammarWork).
class GivingUpConstraint final : public engine::TokenConstraint {
 public:
  explicit GivingUpConstraint(int tokens) : inner_(5, 0, {}), tokens_(tokens) {}
  void mask(float* logits, int vocab) const override { inner_.mask(logits, vocab); }
  bool may_end() const override { return inner_.may_end(); }
  void accept(int32_t token) override { inner_.accept(token); }
  std::string failure() const override { return inner_.accepted() >= tokens_ ? "gave up" : ""; }

 private:
  StridedConstraint inner_;
  int tokens_;
};

}  // namespace

// A constraint that cannot go on ends its request with its error, without the token drawn under
// it; the request beside it, host-masked or device-masked, runs to its end.
TEST_F(EngineMasks, AConstraintThatGivesUpEndsItsRequestWithAnError) {
  for (const std::string device : {"cpu", "test-device"}) {
    SCOPED_TRACE(device);
    engine::Engine engine(std::make_unique<CountingExecutor>(*model_, device), small_config());
    const io::ModelConfig& mc = engine.model_config();
    engine::RequestParams failing = glms::testing::greedy_request(glms::testing::prompt_tokens(9, mc.vocab_size, 7), 12);
    failing.ignore_eos = true;
    failing.constraint = std::make_shared<GivingUpConstraint>(4);
    engine::RequestParams plain = glms::testing::greedy_request(glms::testing::prompt_tokens(11, mc.vocab_size, 8), 12);
    plain.ignore_eos = true;
    Pending a(engine, failing), b(engine, plain);
    const glms::testing::Collected failed = a.get(), finished = b.get();
    EXPECT_EQ(failed.last.finish_reason, "error");
    EXPECT_EQ(failed.last.error, "gave up");
    EXPECT_TRUE(failed.last.request_error) << "the request's own fault: an HTTP 400";
    EXPECT_EQ(failed.tokens.size(), 4u);
    EXPECT_EQ(finished.last.finish_reason, "length");
    EXPECT_EQ(finished.tokens.size(), 12u);
  }
}

// vLLM's allowed_token_ids and bad_words, applied on the host: every drawn token is one of the
// allowed ones, and a bad word's last token is never drawn after the rest of it was generated
// (generated tokens only: a word that begins in the prompt is not matched).
TEST_F(EngineMasks, AllowedTokensAndBadWordsHoldBackTheirTokens) {
  engine::Engine engine(*model_, small_config());
  const int vocab = engine.model_config().vocab_size;
  const std::vector<int32_t> prompt = glms::testing::prompt_tokens(9, vocab, 81);
  auto run = [&](auto adjust) {
    engine::RequestParams params = glms::testing::greedy_request(prompt, 8);
    adjust(params);
    return Pending(engine, params).get().tokens;
  };
  const std::vector<int32_t> free = run([](engine::RequestParams&) {});
  ASSERT_EQ(free.size(), 8u);

  std::vector<int32_t> allowed;
  for (int32_t t = 3; allowed.size() < 3; ++t)
    if (std::find(free.begin(), free.end(), t) == free.end()) allowed.push_back(t);
  for (const float temperature : {0.0f, 1.0f}) {
    const std::vector<int32_t> only = run([&](engine::RequestParams& p) {
      p.allowed_token_ids = allowed;
      p.sampling.temperature = temperature;
      p.sampling.seed = 5;
    });
    ASSERT_EQ(only.size(), 8u);
    for (const int32_t t : only)
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t << " at temperature " << temperature;
  }

  const std::vector<int32_t> first_banned = run([&](engine::RequestParams& p) { p.bad_word_ids = {{free[0]}}; });
  EXPECT_NE(first_banned[0], free[0]);
  for (const int32_t t : first_banned) EXPECT_NE(t, free[0]) << "a one-token bad word is never drawn";
  const std::vector<int32_t> pair_banned =
      run([&](engine::RequestParams& p) { p.bad_word_ids = {{free[1], free[2]}, {free[0], free[1]}}; });
  EXPECT_EQ(pair_banned[0], free[0]);
  EXPECT_NE(pair_banned[1], free[1]) << "the second token of a bad word after its first";
  const std::vector<int32_t> from_prompt =
      run([&](engine::RequestParams& p) { p.bad_word_ids = {{prompt.back(), free[0]}}; });
  EXPECT_EQ(from_prompt, free) << "a bad word that begins in the prompt is not matched";

  // Only the EOS ids allowed while min_tokens holds them back: nothing may come next, and the
  // request ends with an error instead of drawing from nothing.
  engine::RequestParams stuck = glms::testing::greedy_request(prompt, 8);
  stuck.ignore_eos = false;
  stuck.allowed_token_ids = engine.model_config().eos_token_ids;
  stuck.min_tokens = 3;
  const glms::testing::Collected none = Pending(engine, stuck).get();
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.last.finish_reason, "error");
  EXPECT_NE(none.last.error.find("no token may come next"), std::string::npos) << none.last.error;
}

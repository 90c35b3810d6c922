// The serving engine and single-request generation over the CUDA runner against the CPU ones on
// the bundled model: concurrent greedy requests (chunked prefills mixed with decodes, graph
// replays of decode steps) produce the same tokens, up to near-ties: where the two paths part,
// the CPU's logits of the two candidate tokens must be within bf16 noise of each other; so do
// structured-output requests, whose masks CUDA applies on the device. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "engine/generator.h"
#include "io/model_config.h"
#include "model/cuda/model.h"
#include "ops/cuda/cuda_ops.h"
#include "pending_request.h"
#include "strided_constraint.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::Pending;
using glms::testing::random_tokens;

namespace {

class CudaEngine : public glms::testing::CudaTest {};

// The CPU model's logit of `a` minus that of `b` after `tokens`, with a cache of `dtype`.
float logit_gap(const model::Glm5Model& m, const std::vector<int32_t>& tokens, int32_t a, int32_t b,
                kv::CacheDtype dtype) {
  constexpr int kBlock = 16;
  const int blocks = (static_cast<int>(tokens.size()) + kBlock - 1) / kBlock;
  kv::CacheLayout layout = m.cache_layout(kBlock);
  layout.dtype = dtype;
  kv::PagedLatentCache cache(std::move(layout), blocks);
  std::vector<int32_t> table(blocks);
  for (int i = 0; i < blocks; ++i) table[i] = i;
  model::ForwardBatch batch;
  batch.add_sequence(tokens, 0, table, kBlock, false);
  const auto logits = m.forward(batch, cache);
  return logits[a] - logits[b];
}

// Greedy tokens agree, or first differ where the CPU's top two are a near-tie.
void expect_same_up_to_near_ties(const model::Glm5Model& m, const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& expected, const std::vector<int32_t>& got,
                                 kv::CacheDtype dtype = kv::CacheDtype::kAuto) {
  ASSERT_EQ(got.size(), expected.size());
  const auto split = std::mismatch(expected.begin(), expected.end(), got.begin());
  if (split.first == expected.end()) return;
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), expected.begin(), split.first);
  const float gap = logit_gap(m, context, *split.first, *split.second, dtype);
  std::printf("tokens part at %td of %zu; the CPU's logit gap there is %.4f\n", split.first - expected.begin(),
              expected.size(), gap);
  EXPECT_LT(gap, 0.1f) << "CUDA chose token " << *split.second << " where the CPU's choice " << *split.first
                       << " leads by more than bf16 noise";
}

model::ModelWeights bundled() {
  return model::load_weights(GLMS_SOURCE_DIR "/models/glm5-tiny-code", {.load_mtp = false, .shard = {}});
}

// Greedy requests for `prompts`, submitted together; their tokens.
std::vector<std::vector<int32_t>> run_greedy(engine::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                             int max_tokens) {
  std::vector<std::unique_ptr<Pending>> pending;
  for (const auto& prompt : prompts) {
    engine::RequestParams params;
    params.prompt_ids = prompt;
    params.max_tokens = max_tokens;
    params.sampling.temperature = 0.0f;
    params.ignore_eos = true;
    pending.push_back(std::make_unique<Pending>(engine, params));
  }
  std::vector<std::vector<int32_t>> outputs;
  for (auto& p : pending) outputs.push_back(p->get().tokens);
  return outputs;
}

// A constrained request: `kind` 0 greedy ignoring EOS, 1 greedy that may end, 2 sampled.
struct ConstrainedRequest {
  engine::RequestParams params;
  std::shared_ptr<glms::testing::StridedConstraint> constraint;
};
ConstrainedRequest constrained(const std::vector<int32_t>& prompt, int kind, int period, const io::ModelConfig& mc) {
  ConstrainedRequest r;
  r.params.prompt_ids = prompt;
  r.params.max_tokens = 20;
  r.params.sampling.temperature = 0.0f;
  r.params.ignore_eos = kind != 1;
  if (kind == 2) r.params.sampling = {0.8f, 0.95f, 0, 0.0f, 90u + static_cast<uint64_t>(period)};
  r.constraint = std::make_shared<glms::testing::StridedConstraint>(
      period, 4, r.params.ignore_eos ? std::vector<int32_t>{} : mc.eos_token_ids);
  r.params.constraint = r.constraint;
  return r;
}

engine::EngineConfig small_engine_config() {
  engine::EngineConfig config;
  config.max_num_seqs = 8;
  config.max_batch_tokens = 64;
  config.max_model_len = 512;
  config.kv_cache_bytes = int64_t{256} << 20;  // not the GPU's free memory: other tests share it
  return config;
}

}  // namespace

// Structured outputs on CUDA: constrained rows masked and drawn on the device (the default) give
// the tokens of the same requests whose rows come back to be masked on the host
// (device_token_masks off), greedy and sampled, each request alone so that both engines run the
// same batches; every token is one its mask allowed.
TEST_F(CudaEngine, DeviceTokenMasksDrawTheHostMasksTokens) {
  const io::ModelConfig mc = bundled().config;
  std::vector<std::vector<int32_t>> tokens[2];
  for (const bool on_device : {true, false}) {
    engine::EngineConfig config = small_engine_config();
    config.device_token_masks = on_device;
    engine::Engine engine(model::make_cuda_runner(bundled()), config);
    ASSERT_EQ(engine.config().device_token_masks, on_device);
    for (int i = 0; i < 6; ++i) {
      ConstrainedRequest r = constrained(random_tokens(11 + 13 * i, mc.vocab_size, 500 + i), i % 3, 3 + i, mc);
      tokens[on_device].push_back(Pending(engine, r.params).get().tokens);
      EXPECT_EQ(r.constraint->violations(), 0) << "request " << i << (on_device ? " on the device" : " on the host");
      EXPECT_FALSE(tokens[on_device].back().empty());
    }
  }
  for (size_t i = 0; i < tokens[0].size(); ++i) EXPECT_EQ(tokens[1][i], tokens[0][i]) << "request " << i;
}

// Concurrent constrained greedy requests (several masked rows a step, chunked prefills beside
// decodes, graph replays) on CUDA against the CPU engine's host masks, up to near-ties.
TEST_F(CudaEngine, ConcurrentConstrainedRequestsMatchTheCpuEngine) {
  const model::Glm5Model cpu_model(bundled());
  const io::ModelConfig& mc = cpu_model.config();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_tokens(7 + 23 * i, mc.vocab_size, 700 + i));
  auto run = [&](engine::Engine& engine) {
    std::vector<ConstrainedRequest> requests;
    std::vector<std::unique_ptr<Pending>> pending;
    for (size_t i = 0; i < prompts.size(); ++i) {
      requests.push_back(constrained(prompts[i], 0, 2 + static_cast<int>(i), mc));
      pending.push_back(std::make_unique<Pending>(engine, requests.back().params));
    }
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < pending.size(); ++i) {
      out.push_back(pending[i]->get().tokens);
      EXPECT_EQ(requests[i].constraint->violations(), 0) << "request " << i;
    }
    return out;
  };
  engine::Engine cpu(cpu_model, small_engine_config());
  engine::Engine gpu(model::make_cuda_runner(bundled()), small_engine_config());
  const auto expected = run(cpu);
  const auto got = run(gpu);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_up_to_near_ties(cpu_model, prompts[i], expected[i], got[i]);
  }
}

// Six requests of 7 to 122 prompt tokens at once, greedy, on both engines with a cache of `dtype`.
void concurrent_greedy_on_both(kv::CacheDtype dtype) {
  const model::Glm5Model cpu_model(bundled());
  const int vocab = cpu_model.config().vocab_size;
  engine::EngineConfig config;
  config.max_num_seqs = 8;
  config.max_batch_tokens = 64;  // prompts over 64 tokens prefill in chunks beside decodes
  config.max_model_len = 512;
  config.kv_cache_bytes = int64_t{256} << 20;  // not the GPU's free memory: other tests share it
  config.kv_cache_dtype = dtype;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_tokens(7 + 23 * i, vocab, 100 + i));

  engine::Engine cpu(cpu_model, config);
  engine::Engine gpu(model::make_cuda_runner(bundled()), config);
  const auto expected = run_greedy(cpu, prompts, 24);
  const auto got = run_greedy(gpu, prompts, 24);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_up_to_near_ties(cpu_model, prompts[i], expected[i], got[i], dtype);
  }
}

TEST_F(CudaEngine, ConcurrentGreedyRequestsMatchTheCpuEngine) { concurrent_greedy_on_both(kv::CacheDtype::kAuto); }

// --kv-cache-dtype fp8 through the engine: the device stores FP8 rows, the CPU rounds its rows
// the same way, and chunked prefills beside decodes read them back.
TEST_F(CudaEngine, ConcurrentGreedyRequestsWithAnFp8CacheMatchTheCpuEngine) {
  concurrent_greedy_on_both(kv::CacheDtype::kFp8E4m3);
}

TEST_F(CudaEngine, GenerateOverTheCudaRunnerMatchesCpu) {
  const model::Glm5Model cpu_model(bundled());
  engine::GenerateOptions options;
  options.max_tokens = 32;
  options.sampling.temperature = 0.0f;
  options.prefill_chunk = 40;
  const auto prompt = random_tokens(90, cpu_model.config().vocab_size, 7);
  const auto runner = model::make_cuda_runner(bundled());
  expect_same_up_to_near_ties(cpu_model, prompt, engine::generate(cpu_model, prompt, options).output_ids,
                              engine::generate(*runner, prompt, options).output_ids);
}

// The runner without CUDA graphs (vLLM's --enforce-eager) launches a decode step's kernels one by
// one instead of replaying them: the graphed runner's greedy tokens.
TEST_F(CudaEngine, AnEagerRunnerGivesTheGraphedRunnersTokens) {
  engine::GenerateOptions options;
  options.max_tokens = 32;
  options.sampling.temperature = 0.0f;
  options.prefill_chunk = 40;
  const auto prompt = random_tokens(90, bundled().config.vocab_size, 8);
  const auto graphed = model::make_cuda_runner(bundled());
  model::CudaRunnerOptions eager_options;
  eager_options.cuda_graphs = false;
  const auto eager = model::make_cuda_runner(bundled(), {}, eager_options);
  EXPECT_EQ(engine::generate(*eager, prompt, options).output_ids, engine::generate(*graphed, prompt, options).output_ids);
}

// MTP speculation on the CUDA runner: the CUDA engine drafting K = 3 tokens with the MTP layer
// on the device gives the CPU engine's plain greedy tokens (up to near-ties), and its drafts are
// accepted about as often as the CPU's (a broken draft layer is accepted almost never).
TEST_F(CudaEngine, SpeculativeDecodingOnCudaMatchesTheCpuEngine) {
  const model::Glm5Model cpu_model(bundled());
  const int vocab = cpu_model.config().vocab_size;
  engine::EngineConfig config;
  config.max_num_seqs = 8;
  config.max_batch_tokens = 64;
  config.max_model_len = 512;
  config.kv_cache_bytes = int64_t{256} << 20;  // not the GPU's free memory: other tests share it
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_tokens(9 + 31 * i, vocab, 300 + i));
  engine::Engine cpu(cpu_model, config);
  engine::EngineConfig spec_config = config;
  spec_config.speculative_steps = 3;
  engine::Engine gpu(model::make_cuda_runner(model::load_weights(GLMS_SOURCE_DIR "/models/glm5-tiny-code")),
                     spec_config);
  const auto expected = run_greedy(cpu, prompts, 32);
  const auto got = run_greedy(gpu, prompts, 32);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_up_to_near_ties(cpu_model, prompts[i], expected[i], got[i]);
  }
  const engine::EngineStats stats = gpu.stats();
  std::printf("CUDA speculation: %lld drafts, %lld accepted\n", static_cast<long long>(stats.spec_draft_tokens),
              static_cast<long long>(stats.spec_accepted_tokens));
  EXPECT_GT(stats.spec_draft_tokens, 0);
  EXPECT_GT(stats.spec_accepted_tokens * 5, stats.spec_draft_tokens) << "drafts accepted less than 1 in 5";
}

// Single-request MTP speculation over the CUDA runner (drafts and verification on the device)
// against plain greedy decoding on the CPU, K = 1..4.
TEST_F(CudaEngine, GenerateSpeculativeOverTheCudaRunnerMatchesCpu) {
  const model::Glm5Model cpu_model(bundled());
  const auto prompt = random_tokens(70, cpu_model.config().vocab_size, 11);
  engine::GenerateOptions options;
  options.max_tokens = 40;
  options.sampling.temperature = 0.0f;
  options.ignore_eos = true;
  options.prefill_chunk = 32;
  const auto expected = engine::generate(cpu_model, prompt, options).output_ids;
  const auto runner = model::make_cuda_runner(model::load_weights(GLMS_SOURCE_DIR "/models/glm5-tiny-code"));
  for (int k = 1; k <= 4; ++k) {
    SCOPED_TRACE("K=" + std::to_string(k));
    options.speculative_steps = k;
    const engine::GenerateResult result = engine::generate(*runner, prompt, options);
    expect_same_up_to_near_ties(cpu_model, prompt, expected, result.output_ids);
    std::printf("CUDA K=%d: acceptance length %.2f\n", k, result.speculative.acceptance_length());
    EXPECT_GT(result.speculative.acceptance_length(), 1.3) << "the device's drafts are accepted like the CPU's";
  }
}

// Synthetic weights (serve --synthetic, the node run's model) draft with the MTP layer they make
// for a config that has one: the engine takes --speculative on them, and the drafts run. Random
// weights accept few drafts, so only that they run is checked here; greedy exactness of
// speculation is checked on the bundled model above.
TEST_F(CudaEngine, SyntheticWeightsDraftWithTheirMtpLayer) {
  io::ModelConfig config = io::load_model_config(GLMS_SOURCE_DIR "/models/glm5-tiny-code/config.json");
  ASSERT_GT(config.num_nextn_predict_layers, 0);
  engine::EngineConfig spec_config;
  spec_config.max_num_seqs = 4;
  spec_config.max_batch_tokens = 64;
  spec_config.max_model_len = 256;
  spec_config.kv_cache_bytes = int64_t{64} << 20;
  spec_config.speculative_steps = 3;
  engine::Engine gpu(model::make_synthetic_cuda_runner(config, 7), spec_config);
  const auto got = run_greedy(gpu, {random_tokens(40, config.vocab_size, 5), random_tokens(9, config.vocab_size, 6)}, 16);
  for (const auto& tokens : got) EXPECT_EQ(tokens.size(), 16u);
  EXPECT_GT(gpu.stats().spec_draft_tokens, 0);
  config.num_nextn_predict_layers = 0;
  EXPECT_FALSE(model::make_synthetic_cuda_runner(config, 7)->has_mtp());
}

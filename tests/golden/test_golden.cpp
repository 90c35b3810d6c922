// The CPU engine against transformers 5.17 (GlmMoeDsaForCausalLM, fp32, eager) on fixtures made
// by tools/make_golden.py and tools/train_tiny.py: random-weight GLM-5 and GLM-5.2 (IndexShare,
// grouped routing) models with prompts longer than index_topk, and the bundled trained model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/generator.h"
#include "io/safetensors.h"
#include "model/glm5.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::relative_l2;

namespace {

const std::filesystem::path kSource = GLMS_SOURCE_DIR;

std::vector<int32_t> to_i32(const std::vector<int64_t>& values) { return {values.begin(), values.end()}; }

// "tests/golden/glm5-random" -> "glm5_random" (test names allow only [A-Za-z0-9_]).
std::string fixture_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = std::filesystem::path(info.param).filename().string();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = kSource / GetParam();
    ASSERT_TRUE(std::filesystem::exists(dir_ / "golden.safetensors")) << "missing fixture " << dir_;
    golden_ = std::make_unique<io::Checkpoint>(io::Checkpoint::open(dir_ / "golden.safetensors"));
    model_ = std::make_unique<model::Glm5Model>(model::load_weights(dir_.string()));
  }
  std::vector<float> f32(const std::string& name) const { return io::read_f32(golden_->get(name)); }
  std::vector<int32_t> ids(const std::string& name) const { return to_i32(io::read_i64(golden_->get(name))); }

  std::filesystem::path dir_;
  std::unique_ptr<io::Checkpoint> golden_;
  std::unique_ptr<model::Glm5Model> model_;
};

}  // namespace

TEST_P(Golden, PromptLogitsAndHiddenStatesMatchTransformers) {
  const auto prompt = ids("prompt_ids");
  const int vocab = model_->config().vocab_size, hidden = model_->config().hidden_size;
  ASSERT_GT(static_cast<int>(prompt.size()), model_->config().index_topk) << "the prompt must exceed index_topk";
  const int block_size = 16, num_blocks = static_cast<int>(prompt.size()) / block_size + 1;
  kv::PagedLatentCache cache(model_->cache_layout(block_size), num_blocks);
  std::vector<int32_t> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) table[b] = num_blocks - 1 - b;
  model::ForwardBatch batch;
  batch.add_sequence(prompt, 0, table, block_size, true);
  model::ForwardTrace trace;
  const auto logits = model_->forward(batch, cache, &trace);

  // Fixtures store every prompt position's logits, or only the rows listed in prompt_logits_rows.
  std::vector<int32_t> rows;
  if (golden_->contains("prompt_logits_rows")) {
    rows = ids("prompt_logits_rows");
  } else {
    for (int p = 0; p < static_cast<int>(prompt.size()); ++p) rows.push_back(p);
  }
  const auto expected = f32("prompt_logits");
  ASSERT_EQ(expected.size(), rows.size() * vocab);
  std::vector<float> ours;
  double worst_row = 0.0;
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_LT(rows[r], static_cast<int>(prompt.size()));
    const float* row = logits.data() + static_cast<size_t>(rows[r]) * vocab;
    ours.insert(ours.end(), row, row + vocab);
    worst_row = std::max(worst_row, relative_l2(row, expected.data() + r * vocab, vocab));
  }
  const double error = relative_l2(ours.data(), expected.data(), ours.size());
  RecordProperty("prompt_logits_relative_l2", std::to_string(error));
  std::printf("[ golden   ] %s: prompt logits relative L2 %.3g (worst row %.3g) over %zu of %zu positions\n",
              GetParam().c_str(), error, worst_row, rows.size(), prompt.size());
  EXPECT_LT(error, 1e-4);
  EXPECT_LT(worst_row, 1e-4);

  // Embeddings and each layer's output but the last (transformers norms its last entry).
  const auto states = f32("hidden_states");
  const size_t per_state = prompt.size() * hidden;
  ASSERT_EQ(states.size(), trace.hidden_states.size() * per_state);
  for (size_t l = 0; l + 1 < trace.hidden_states.size(); ++l) {
    EXPECT_LT(relative_l2(trace.hidden_states[l].data(), states.data() + l * per_state, per_state), 1e-4)
        << "hidden state " << l;
  }
  // The last layer's output before the final norm (what the MTP head consumes).
  if (golden_->contains("last_hidden_prenorm")) {
    const auto last = f32("last_hidden_prenorm");
    ASSERT_EQ(last.size(), trace.last_hidden.size());
    EXPECT_LT(relative_l2(trace.last_hidden.data(), last.data(), last.size()), 1e-4);
  }
}

TEST_P(Golden, GreedyTokensMatchTransformers) {
  const auto prompt = ids("prompt_ids");
  const auto expected_ids = ids("greedy_ids");
  const auto expected_logits = f32("greedy_logits");
  const int vocab = model_->config().vocab_size;
  engine::GenerateOptions options;
  options.max_tokens = static_cast<int>(expected_ids.size());
  options.sampling.temperature = 0.0f;
  options.ignore_eos = true;
  options.prefill_chunk = 64;
  options.block_size = 16;
  const auto result = engine::generate(*model_, prompt, options);
  EXPECT_EQ(result.output_ids, expected_ids);

  // The same steps by incremental decode, with their logits.
  const int block_size = 16, total = static_cast<int>(prompt.size() + expected_ids.size());
  const int num_blocks = total / block_size + 1;
  kv::PagedLatentCache cache(model_->cache_layout(block_size), num_blocks);
  std::vector<int32_t> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) table[b] = b;
  model::ForwardBatch prefill;
  prefill.add_sequence(prompt, 0, table, block_size, false);
  auto logits = model_->forward(prefill, cache);
  for (size_t step = 0; step < expected_ids.size(); ++step) {
    EXPECT_LT(relative_l2(logits.data(), expected_logits.data() + step * vocab, vocab), 1e-4) << "step " << step;
    model::ForwardBatch next;
    next.add_sequence({expected_ids[step]}, static_cast<int>(prompt.size() + step), table, block_size, false);
    logits = model_->forward(next, cache);
  }
}

TEST_P(Golden, BatchedPromptsMatchTransformers) {
  const int vocab = model_->config().vocab_size, block_size = 16;
  kv::PagedLatentCache cache(model_->cache_layout(block_size), 256);
  model::ForwardBatch batch;
  std::vector<std::vector<float>> expected;
  int next_block = 0;
  for (int k = 0; golden_->contains("extra_prompt_ids_" + std::to_string(k)); ++k) {
    const auto prompt = ids("extra_prompt_ids_" + std::to_string(k));
    std::vector<int32_t> table;
    for (size_t b = 0; b < prompt.size() / block_size + 1; ++b) table.push_back(next_block++);
    ASSERT_LE(next_block, 256);
    batch.add_sequence(prompt, 0, table, block_size, false);
    expected.push_back(f32("extra_prompt_last_logits_" + std::to_string(k)));
  }
  ASSERT_GE(expected.size(), 2u) << "fixture has too few extra prompts";
  const auto logits = model_->forward(batch, cache);
  for (size_t k = 0; k < expected.size(); ++k)
    EXPECT_LT(relative_l2(logits.data() + k * vocab, expected[k].data(), vocab), 1e-4) << "prompt " << k;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden,
                         ::testing::Values("tests/golden/glm5-random", "tests/golden/glm52-random",
                                           "models/glm5-tiny-code"),
                         fixture_name);

// The MTP draft layer against tools/glm5_torch.py (transformers has no MTP): for each prompt
// position t, MTP(h_prenorm[t], token t+1) gives the draft logits for position t + 2.
class GoldenMtp : public Golden {};

TEST_P(GoldenMtp, DraftLogitsMatchTheTorchReference) {
  ASSERT_TRUE(golden_->contains("mtp_draft_logits")) << "fixture without an MTP reference";
  ASSERT_EQ(model_->num_mtp_layers(), 1);
  const auto prompt = ids("prompt_ids");
  const auto next_ids = ids("mtp_next_ids");
  ASSERT_EQ(next_ids.size(), prompt.size());
  const int vocab = model_->config().vocab_size, block_size = 16;
  const int num_blocks = static_cast<int>(prompt.size()) / block_size + 1;
  std::vector<int32_t> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) table[b] = b;

  kv::PagedLatentCache cache(model_->cache_layout(block_size), num_blocks);
  model::ForwardBatch main_batch;
  main_batch.add_sequence(prompt, 0, table, block_size, false);
  model::ForwardTrace trace;
  model_->forward(main_batch, cache, &trace);

  kv::PagedLatentCache mtp_cache(model_->mtp_cache_layout(block_size), num_blocks);
  model::ForwardBatch draft_batch;
  draft_batch.add_sequence(next_ids, 0, table, block_size, true);
  const auto logits = model_->mtp_forward(0, draft_batch, trace.last_hidden.data(), mtp_cache);

  std::vector<int32_t> rows;
  if (golden_->contains("mtp_draft_rows")) rows = ids("mtp_draft_rows");
  else for (int p = 0; p < static_cast<int>(prompt.size()); ++p) rows.push_back(p);
  const auto expected = f32("mtp_draft_logits");
  ASSERT_EQ(expected.size(), rows.size() * vocab);
  double worst = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    worst = std::max(worst, relative_l2(logits.data() + static_cast<size_t>(rows[r]) * vocab,
                                        expected.data() + r * vocab, vocab));
  std::printf("[ golden   ] %s: MTP draft logits worst row relative L2 %.3g over %zu rows\n", GetParam().c_str(),
              worst, rows.size());
  EXPECT_LT(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenMtp, ::testing::Values("tests/golden/glm52-random", "models/glm5-tiny-code"),
                         fixture_name);

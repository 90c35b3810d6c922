// The CUDA model holds what model/cuda_memory.h (and so glmserve plan) counts: the widths it
// reads off its weights are the ones the plan derives from the shard, its workspaces are the
// bytes the plan sums for them, and its cache takes the plan's bytes per token. Skips without a GPU.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/model_config.h"
#include "model/cuda/model.h"
#include "model/cuda_memory.h"
#include "random_model.h"
#include "support/cuda_buffers.h"

using namespace glms;

namespace {

class CudaMemory : public glms::testing::CudaTest {};

// Widths that divide by 2 (heads, experts, intermediate columns) and MXFP4's 32-column blocks.
io::ModelConfig divisible_config(const std::filesystem::path& dir) {
  glms::testing::RandomModelSpec spec;
  spec.hidden_size = 128;
  spec.intermediate_size = 256;
  spec.moe_intermediate_size = 128;
  spec.num_attention_heads = 4;
  spec.q_lora_rank = 128;
  spec.kv_lora_rank = 32;
  spec.v_head_dim = 32;
  spec.index_n_heads = 4;
  spec.index_head_dim = 16;
  return io::load_model_config(glms::testing::write_random_model(dir, spec));
}

}  // namespace

TEST_F(CudaMemory, WorkspacesAndCacheAreWhatThePlanCounts) {
  glms::testing::TempDir dir("cuda_memory");
  const io::ModelConfig config = divisible_config(dir.path);
  model::CudaModelOptions options;
  options.block_size = 16;
  options.num_blocks = 24;
  options.max_tokens = 96;
  options.max_sequences = 5;
  options.max_logits = 7;
  options.max_context = 300;
  struct Case {
    const char* name;
    model::ModelShard shard;
    ops::WeightFormat experts;
    bool fp8_linears;
  };
  const Case cases[] = {
      {"whole, bf16 experts", {}, ops::WeightFormat::Plain, false},
      {"tp rank 1 of 2, MXFP4 experts", {.tp_rank = 1, .tp_size = 2}, ops::WeightFormat::Mxfp4, false},
      {"tp 2, experts whole over the ranks", {.tp_rank = 0, .tp_size = 2, .expert_parallel = true},
       ops::WeightFormat::Mxfp4, false},
      {"whole, FP8 linear layers", {}, ops::WeightFormat::Plain, true},
      {"tp rank 1 of 2, FP8 linear layers", {.tp_rank = 1, .tp_size = 2}, ops::WeightFormat::Mxfp4, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    options.linear_weights = c.fp8_linears ? model::CudaLinearWeights::kFp8 : model::CudaLinearWeights::kAsStored;
    const auto gpu = model::CudaGlm5Model::synthetic(config, 7, options, c.experts, c.shard);
    const model::CudaMemoryReport report = gpu->memory_report();
    const model::CudaRankWidths planned =
        model::cuda_rank_widths(config, c.shard, c.experts != ops::WeightFormat::Plain, false, c.fp8_linears,
                                c.experts == ops::WeightFormat::Mxfp4);
    EXPECT_EQ(report.widths.fp8_linear_cols, planned.fp8_linear_cols);
    EXPECT_EQ(gpu->linear_matrices().second > 0, c.fp8_linears);
    EXPECT_EQ(report.widths.heads, planned.heads);
    EXPECT_EQ(report.widths.mlp_inter, planned.mlp_inter);
    EXPECT_EQ(report.widths.local_experts, planned.local_experts);
    EXPECT_EQ(report.widths.expert_inter, planned.expert_inter);
    EXPECT_EQ(report.widths.quantised_experts, planned.quantised_experts);
    EXPECT_EQ(report.widths.tiled_mxfp4_experts, planned.tiled_mxfp4_experts);
    EXPECT_EQ(report.limits.max_tokens, options.max_tokens);
    EXPECT_EQ(report.limits.max_logits, options.max_logits);
    EXPECT_EQ(report.workspaces, model::cuda_workspace_bytes(config, planned, report.limits));
    EXPECT_GT(report.workspaces, int64_t{4} * options.max_tokens * options.max_context);  // the indexer scores alone
    // The cache: every layer's rows for the engine's blocks and the idle rank's one.
    EXPECT_EQ(gpu->cache_bytes(),
              int64_t{options.num_blocks + 1} * options.block_size * model::cuda_cache_bytes_per_token(config));
    EXPECT_EQ(report.budget, 0);  // the cache size was given: nothing was fitted
  }
}

TEST_F(CudaMemory, AFittedCacheTakesTheBudgetLessWhatIsInUseAndTheMargin) {
  glms::testing::TempDir dir("cuda_memory_fit");
  const io::ModelConfig config = divisible_config(dir.path);
  model::CudaModelOptions options;
  options.block_size = 16;
  options.num_blocks = 0;
  options.max_tokens = 64;
  options.max_sequences = 4;
  options.max_context = 256;
  // A small share of the device, so that tests running beside this one keep theirs; the budget
  // must still exceed what this process already holds.
  const auto [free_bytes, total_bytes] = ops::cuda::memory_info();
  const double in_use = static_cast<double>(total_bytes - free_bytes);
  options.gpu_memory_utilization = std::min(1.0, (in_use + 8.0 * (1 << 30)) / static_cast<double>(total_bytes));
  const auto gpu = model::CudaGlm5Model::synthetic(config, 7, options);
  const model::CudaMemoryReport report = gpu->memory_report();
  ASSERT_GT(report.budget, 0);
  EXPECT_EQ(report.device_total, static_cast<int64_t>(total_bytes));
  EXPECT_GT(report.runtime(), 0);  // the CUDA context at least
  const int64_t per_block = model::cuda_cache_bytes_per_token(config) * options.block_size;
  const int64_t left = report.budget - report.in_use - model::kCudaMemoryMarginBytes;
  EXPECT_EQ(gpu->options().num_blocks, model::cuda_cache_blocks_that_fit(left, per_block / options.block_size, 16));
  EXPECT_LE(report.cache, left);
  EXPECT_GT(report.cache, left - 2 * per_block);
}

// A rank that does not fit says what did not: the layer whose weights were being made, the
// weights already made, and for the step buffers and the cache the flags that size them. One
// allocation past the device's memory (a dense MLP of 2^29 columns: 256 GiB), so that tests
// beside this one keep theirs.
TEST_F(CudaMemory, RunningOutOfMemoryAtLoadNamesWhatDidNotFit) {
  glms::testing::TempDir dir("cuda_memory_oom");
  io::ModelConfig config = divisible_config(dir.path);
  ASSERT_FALSE(config.layer_is_moe[0]);
  config.intermediate_size = 1 << 29;
  model::CudaModelOptions options;
  options.block_size = 16;
  options.num_blocks = 64;
  options.max_tokens = 64;
  options.max_sequences = 4;
  options.max_context = 256;
  try {
    model::CudaGlm5Model::synthetic(config, 7, options);
    FAIL() << "256 GiB of one layer's weights fitted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("for the weights of decoder layer 0 of " + std::to_string(config.num_hidden_layers)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("of weights on the GPU before it"), std::string::npos) << message;
  }
}

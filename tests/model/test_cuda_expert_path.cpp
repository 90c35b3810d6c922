// Which kernels take a step's routed experts (model/cuda/expert_path.h), at GLM-5.2's widths
// (hidden 6144, expert inter 2048, 256 experts, top-8) with the default options: the paths
// docs/performance.md measured for each weight format and step size. Runs without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "io/model_config.h"
#include "model/cuda/expert_path.h"
#include "model/cuda_memory.h"

using namespace glms;
using model::ExpertPath;
using model::ExpertStep;

namespace {

constexpr int64_t kHidden = 6144, kInter = 2048, kExperts = 256, kTopK = 8;

ops::cuda::ExpertWeights weights(ops::WeightFormat format) {
  ops::cuda::ExpertWeights w;
  w.format = format;
  w.mxfp4_tiled = format == ops::WeightFormat::Mxfp4;
  return w;
}

// A step of `tokens` rows on one GPU (every pair this rank's), pair buffers for `capacity` pairs.
ExpertStep one_gpu_step(int64_t tokens, bool host_sync_ok = true) {
  ExpertStep step;
  step.pairs = tokens * kTopK;
  step.local_pairs = step.pairs;
  step.pairs_per_expert = (step.pairs + kExperts - 1) / kExperts;
  step.host_sync_ok = host_sync_ok;
  step.fp8_staged = true;
  return step;
}

ExpertPath path(const model::CudaModelOptions& options, ops::WeightFormat format, const ExpertStep& step,
                int64_t capacity, int64_t hidden = kHidden, int64_t inter = kInter) {
  return model::choose_expert_path(options, kExperts, weights(format), hidden, inter, capacity, step);
}

// The workspaces of rank 0 of GLM-5.2 over DP8 attention + EP8 experts (32 a layer), with
// `quantised` MXFP4 experts in the tile layout or bf16 ones, sized for steps of `max_tokens`
// tokens on each rank (limits otherwise the defaults: widened_experts_min_pairs among them).
model::CudaWorkspaces<int64_t> ep8_rank_workspaces(int max_tokens, bool quantised) {
  const io::ModelConfig config = io::load_model_config(std::string(GLMS_SOURCE_DIR) + "/models/configs/glm-5.2.json");
  model::CudaRankWidths widths;
  widths.dp_ranks = 8;
  widths.local_experts = kExperts / 8;
  widths.expert_inter = kInter;
  widths.quantised_experts = widths.tiled_mxfp4_experts = quantised;
  model::CudaStepLimits limits;
  limits.max_tokens = max_tokens;
  limits.max_logits = 1;
  limits.max_context = 4096;
  limits.block_size = 64;
  model::CudaWorkspaces<int64_t> sizes;
  model::make_cuda_workspaces(sizes, config, widths, limits, [](int64_t bytes) { return bytes; });
  return sizes;
}

}  // namespace

TEST(CudaExpertPath, Mxfp4StreamsDecodeStepsAndWidensPrefillsInRegisters) {
  const model::CudaModelOptions options;
  const int64_t capacity = 8192 * kTopK;
  const auto mxfp4 = ops::WeightFormat::Mxfp4;
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(8, false), capacity), ExpertPath::kSmall);       // 1 pair an expert
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(512, false), capacity), ExpertPath::kStreamed);  // 16
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(1024, false), capacity), ExpertPath::kStreamed);  // 32
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(1056), capacity), ExpertPath::kRegisterWidened);  // 33
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(2048), capacity), ExpertPath::kRegisterWidened);
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(8192), capacity), ExpertPath::kRegisterWidened);
}

TEST(CudaExpertPath, WithoutTheRegisterWidenedGemmsMxfp4TakesTheSharedMemoryOnes) {
  model::CudaModelOptions options;
  options.wgmma_rs_mxfp4_experts_min_pairs = 0;
  const int64_t capacity = 8192 * kTopK;
  const auto mxfp4 = ops::WeightFormat::Mxfp4;
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(1536), capacity), ExpertPath::kGrouped);      // 48 pairs an expert
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(2048), capacity), ExpertPath::kSpecialized);  // 64
}

TEST(CudaExpertPath, Bf16AndFp8PrefillsTakeTheirGroupedGemms) {
  const model::CudaModelOptions options;
  const int64_t capacity = 8192 * kTopK;
  const auto bf16 = ops::WeightFormat::Plain, fp8 = ops::WeightFormat::Fp8Block;
  EXPECT_EQ(path(options, bf16, one_gpu_step(512), capacity), ExpertPath::kGrouped);       // 16 pairs an expert
  EXPECT_EQ(path(options, bf16, one_gpu_step(2048), capacity), ExpertPath::kSpecialized);  // 64
  EXPECT_EQ(path(options, bf16, one_gpu_step(8, false), capacity), ExpertPath::kSmall);
  // bf16 decode batches: the small-batch kernels to 2 pairs an expert, the grouped GEMMs from 3
  // (graphed steps: no host sync).
  EXPECT_EQ(path(options, bf16, one_gpu_step(64, false), capacity), ExpertPath::kSmall);
  EXPECT_EQ(path(options, bf16, one_gpu_step(96, false), capacity), ExpertPath::kGrouped);
  EXPECT_EQ(path(options, bf16, one_gpu_step(256, false), capacity), ExpertPath::kGrouped);
  // FP8 keeps the mma.sync kernels to 6 pairs an expert and takes the W8A8 GEMMs from 7; MXFP4
  // keeps its own kernels there.
  EXPECT_EQ(path(options, fp8, one_gpu_step(192, false), capacity), ExpertPath::kSmall);
  EXPECT_EQ(path(options, fp8, one_gpu_step(224, false), capacity), ExpertPath::kW8a8);
  EXPECT_EQ(path(options, ops::WeightFormat::Mxfp4, one_gpu_step(96, false), capacity), ExpertPath::kSmall);
  EXPECT_EQ(path(options, fp8, one_gpu_step(2048), capacity), ExpertPath::kW8a8);
  // Where the W8A8 staging does not fit the pair buffers: the mma.sync kernels up to 64 pairs an
  // expert, then per-expert GEMMs over widened experts, instead of a failed step.
  ExpertStep unstaged = one_gpu_step(2048);
  unstaged.fp8_staged = false;
  EXPECT_EQ(path(options, fp8, unstaged, capacity), ExpertPath::kSmall);
  unstaged = one_gpu_step(4096);
  unstaged.fp8_staged = false;
  EXPECT_EQ(path(options, fp8, unstaged, capacity), ExpertPath::kPerExpertGemms);
}

TEST(CudaExpertPath, WidthsTheGroupedGemmsCannotTileFallBack) {
  const model::CudaModelOptions options;
  const auto mxfp4 = ops::WeightFormat::Mxfp4;
  // hidden 80, inter 28 (the random fixture): no tiles, no grouped GEMMs.
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(2048), 2048 * kTopK, 80, 28), ExpertPath::kPerExpertGemms);
  EXPECT_EQ(path(options, mxfp4, one_gpu_step(2048, false), 2048 * kTopK, 80, 28), ExpertPath::kSmall);
}

// A prefill's MoE over eight data-parallel ranks' gathered rows: more pairs than the pair
// buffers hold, of which this rank's (counted on the host) decide.
TEST(CudaExpertPath, AGatheredPrefillRunsTheGroupedGemmsOverThisRanksPairs) {
  const model::CudaModelOptions options;
  const auto sizes = ep8_rank_workspaces(2048, false);
  EXPECT_GE(sizes.pair_capacity, 2048 * kTopK * 5 / 4) << "a quarter more than one rank's pairs";

  ExpertStep step = one_gpu_step(8 * 2048);  // every rank's rows, gathered
  step.local_pairs = 2048 * kTopK + 300;      // this rank's: a little more than an even share
  const auto mxfp4 = ops::WeightFormat::Mxfp4;
  EXPECT_EQ(path(options, mxfp4, step, sizes.pair_capacity), ExpertPath::kRegisterWidened);
  step.local_pairs = sizes.pair_capacity + 1;  // routing that leans too far: per-expert, then a rank at a time
  EXPECT_EQ(path(options, mxfp4, step, sizes.pair_capacity), ExpertPath::kPerExpertGemms);
}

// By default (widened_experts_min_pairs 1024) an EP8 rank's prefill of 4096 tokens or more on
// each rank widens its tiled MXFP4 experts to bf16 once a layer where its workspaces hold them
// (pair_gate_up, sized for every local expert's gate/up rows only where the rank's steps can bring
// that many pairs an expert, and only for tiled MXFP4 experts).
TEST(CudaExpertPath, ARanksLongPrefillWidensItsExpertsWhereItsWorkspacesHoldThem) {
  const model::CudaModelOptions options;
  EXPECT_EQ(model::CudaStepLimits().widened_experts_min_pairs, options.widened_experts_min_pairs);
  const auto rank = ep8_rank_workspaces(8192, true);  // 8 ranks x 8192 tokens x 8: 2048 pairs an expert
  EXPECT_EQ(rank.widened_experts, kExperts / 8);
  EXPECT_GE(rank.pair_gate_up, 2 * (kExperts / 8) * 2 * kInter * kHidden) << "bytes of the widened gate/up rows";
  EXPECT_EQ(ep8_rank_workspaces(4096, true).widened_experts, kExperts / 8) << "1024 pairs an expert";
  EXPECT_EQ(ep8_rank_workspaces(4095, true).widened_experts, 0) << "just under 1024 pairs an expert";
  EXPECT_EQ(ep8_rank_workspaces(8192, false).widened_experts, 0) << "bf16 experts";

  const auto mxfp4 = ops::WeightFormat::Mxfp4;
  ExpertStep step = one_gpu_step(8 * 8192);  // every rank's rows, gathered: 2048 pairs an expert
  step.local_pairs = 8192 * kTopK;
  step.widening_fits = true;
  EXPECT_EQ(path(options, mxfp4, step, rank.pair_capacity), ExpertPath::kWidened);
  EXPECT_EQ(path(options, ops::WeightFormat::Fp8Block, step, rank.pair_capacity), ExpertPath::kW8a8);
  step.widening_fits = false;
  EXPECT_EQ(path(options, mxfp4, step, rank.pair_capacity), ExpertPath::kRegisterWidened);
  ExpertStep shorter = one_gpu_step(8 * 4096);  // 1024 pairs an expert: widened too
  shorter.local_pairs = 4096 * kTopK;
  shorter.widening_fits = true;
  EXPECT_EQ(path(options, mxfp4, shorter, rank.pair_capacity), ExpertPath::kWidened);
  ExpertStep short_chunk = one_gpu_step(8 * 2048);  // 512 pairs an expert: the widening does not pay
  short_chunk.local_pairs = 2048 * kTopK;
  short_chunk.widening_fits = true;
  EXPECT_EQ(path(options, mxfp4, short_chunk, rank.pair_capacity), ExpertPath::kRegisterWidened);
}

// test_cuda_forward's random model at grouped-GEMM widths (hidden 256, expert width 128, 16
// experts, top-4): its 256-token prefill takes a grouped bf16 GEMM, whose sums bf16_expert_sums
// rounds, and its 2-sequence decode steps the small-batch kernels.
TEST(CudaExpertPath, ARandomModelsLongPrefillTakesTheGroupedBf16Gemms) {
  const model::CudaModelOptions options;
  const int64_t experts = 16, top_k = 4, capacity = 256 * top_k;
  ExpertStep prefill;
  prefill.pairs = prefill.local_pairs = 256 * top_k;
  prefill.pairs_per_expert = prefill.pairs / experts;
  const ExpertPath chosen =
      model::choose_expert_path(options, experts, weights(ops::WeightFormat::Plain), 256, 128, capacity, prefill);
  EXPECT_TRUE(chosen == ExpertPath::kSpecialized || chosen == ExpertPath::kGrouped) << static_cast<int>(chosen);
  ExpertStep decode;
  decode.pairs = decode.local_pairs = 2 * top_k;
  decode.pairs_per_expert = 1;
  decode.host_sync_ok = false;
  EXPECT_EQ(model::choose_expert_path(options, experts, weights(ops::WeightFormat::Plain), 256, 128, capacity, decode),
            ExpertPath::kSmall);
}

// Decode steps are captured as graphs up to the pairs per expert where the experts still need no
// host synchronisation: 64 for the tensor-core experts (an EP8 rank's batch of 64 a rank gathers
// 512 tokens, 16 pairs an expert), 8 for bf16 experts and MX rows not in the tile layout.
TEST(CudaExpertPath, DecodeStepsAreCapturedUpToTheKernelsPairsPerExpert) {
  EXPECT_EQ(model::small_moe_pairs_per_expert(weights(ops::WeightFormat::Mxfp4), kHidden, kInter), 64);
  EXPECT_EQ(model::small_moe_pairs_per_expert(weights(ops::WeightFormat::Fp8Block), kHidden, kInter), 64);
  EXPECT_EQ(model::small_moe_pairs_per_expert(weights(ops::WeightFormat::Plain), kHidden, kInter), 8);
  auto untiled = weights(ops::WeightFormat::Mxfp4);
  untiled.mxfp4_tiled = false;
  EXPECT_EQ(model::small_moe_pairs_per_expert(untiled, kHidden, kInter), 8);
  // Past 64 pairs an expert an MXFP4 step may take per-expert GEMMs eagerly.
  const model::CudaModelOptions options;
  model::CudaModelOptions no_grouped = options;
  no_grouped.wgmma_experts_min_pairs = no_grouped.wgmma_rs_mxfp4_experts_min_pairs = 0;
  no_grouped.specialized_mxfp4_experts_min_pairs = no_grouped.stream_experts_max_pairs = 0;
  EXPECT_EQ(path(no_grouped, ops::WeightFormat::Mxfp4, one_gpu_step(2048), 8192 * kTopK), ExpertPath::kSmall);
  EXPECT_EQ(path(no_grouped, ops::WeightFormat::Mxfp4, one_gpu_step(2049), 8192 * kTopK), ExpertPath::kPerExpertGemms);
}

// A rank of a parallel layout (plan/parallel.h) on GLM-5.2's config: what it holds, what a
// decode step reads, and what its collectives send, against hand-computed values.
#include <gtest/gtest.h>

#include "plan/parallel.h"
#include "plan/roofline.h"

using namespace glms;
using namespace glms::plan;

namespace {
ModelSpec glm52() { return load_model_spec(GLMS_SOURCE_DIR "/models/configs/glm-5.2.json"); }
}  // namespace

TEST(RankShape, OneRankHoldsTheWholeModelButTheMtpLayer) {
  const ModelSpec m = glm52();
  const double mtp = static_cast<double>(m.group_bytes("mtp", "mxfp4"));
  EXPECT_NEAR(rank_weight_bytes(m, "mxfp4", {1, 1}), static_cast<double>(m.weight_bytes("mxfp4")) - mtp, 1.0);
}

TEST(RankShape, ExpertParallelRanksHoldAShareOfTheExpertsAndEverythingElseWhole) {
  const ModelSpec m = glm52();
  const double experts = static_cast<double>(m.group_bytes("routed_experts", "mxfp4"));
  const double whole = rank_weight_bytes(m, "mxfp4", {1, 1});
  // DP8 + EP8: 7/8 of the experts live elsewhere.
  EXPECT_NEAR(rank_weight_bytes(m, "mxfp4", {1, 8}), whole - experts * 7 / 8, 1.0);
  // 32 experts a layer in MXFP4 (4.25 bits) over 75 MoE layers, plus the replicated rest.
  EXPECT_NEAR(experts / 8, 75.0 * 32 * 3 * 6144 * 2048 * 4.25 / 8, 1e6);
}

TEST(RankShape, TensorParallelRanksSplitTheHeadsMatricesButNotQaKvaOrTheIndexer) {
  const ModelSpec m = glm52();
  const double attention = static_cast<double>(m.group_bytes("attention", "bf16"));
  const double replicated = 2.0 * 78 * 6144 * (2048 + 512 + 64);  // q_a and kv_a, bf16
  const double tp1 = rank_weight_bytes(m, "bf16", {1, 1}), tp2 = rank_weight_bytes(m, "bf16", {2, 1});
  const double split = static_cast<double>(m.group_bytes("dense_mlp", "bf16") + m.group_bytes("shared_experts", "bf16")) +
                       static_cast<double>(m.group_bytes("routed_experts", "bf16"));
  EXPECT_NEAR(tp1 - tp2, (attention - replicated) / 2 + split / 2, 1e3);
}

TEST(RankShape, CollectivesOfADecodeStep) {
  const ModelSpec m = glm52();
  EXPECT_EQ(step_collectives(m, {1, 1}, 64).bytes_sent, 0.0);
  // TP4: two fp32 all-reduces of 64 x 6144 a layer, each sending 2 * 3/4 of the message.
  const StepCollectives tp = step_collectives(m, {4, 1}, 64);
  EXPECT_DOUBLE_EQ(tp.bytes_sent, 78 * 2 * 1.5 * 64 * 6144 * 4.0);
  EXPECT_EQ(tp.count, 156);
  // DP8 + EP8: per MoE layer 7 peers' rows in (bf16 rows + 8 bytes an expert) and fp32 sums out,
  // as the CUDA ranks send them by default; bf16 sums where they are asked for.
  const StepCollectives dp = step_collectives(m, {1, 8}, 64);
  EXPECT_DOUBLE_EQ(dp.bytes_sent, 75 * 7 * 64 * (6144 * 2.0 + 8 * 8.0 + 6144 * 4.0));
  EXPECT_EQ(dp.count, 150);
  EXPECT_DOUBLE_EQ(dp.time_s(450e9, 10e-6), 150 * 10e-6 + dp.bytes_sent / 450e9);
  EXPECT_DOUBLE_EQ(step_collectives(m, {1, 8}, 64, true).bytes_sent,
                   75 * 7 * 64 * (6144 * 2.0 + 8 * 8.0 + 6144 * 2.0));
  EXPECT_DOUBLE_EQ(step_collectives(m, {1, 8}, 64, false).bytes_sent, dp.bytes_sent);
}

TEST(RankShape, OneMoeLayersCollectivesAreAStepsShareOfThem) {
  // GLM-5.2: 78 layers, 75 of them MoE. With data parallelism alone every collective is a MoE
  // layer's, so a step's are 75 layers' worth; tensor parallelism adds two all-reduces a layer.
  const ModelSpec m = glm52();
  const StepCollectives dp_layer = moe_layer_collectives(m, {1, 8}, 64), dp_step = step_collectives(m, {1, 8}, 64);
  EXPECT_EQ(dp_layer.count, 2);
  EXPECT_EQ(dp_step.count, 2 * 75);
  EXPECT_NEAR(dp_layer.bytes_sent * 75, dp_step.bytes_sent, 1e-9 * dp_step.bytes_sent);
  // TP4 x DP2: the layer's two all-reduces (2 x 3/4 of 64 fp32 rows each) and one peer's rows in
  // and fp32 sums out (bf16 where asked).
  const StepCollectives both = moe_layer_collectives(m, {4, 2}, 64);
  EXPECT_EQ(both.count, 4);
  EXPECT_DOUBLE_EQ(both.bytes_sent, 2 * 1.5 * 64 * 6144 * 4.0 + 1 * 64 * (6144 * 2.0 + 8 * 8.0 + 6144 * 4.0));
  EXPECT_DOUBLE_EQ(moe_layer_collectives(m, {4, 2}, 64, true).bytes_sent,
                   2 * 1.5 * 64 * 6144 * 4.0 + 1 * 64 * (6144 * 2.0 + 8 * 8.0 + 6144 * 2.0));
  EXPECT_EQ(moe_layer_collectives(m, {1, 1}, 64).count, 0);
}

TEST(RankShape, ADecodeStepReadsTheExpertsTheWholeStepTouches) {
  const ModelSpec m = glm52();
  // Eight ranks of one token each touch what eight tokens touch, an eighth of it on each rank.
  const double one_token_rank = rank_decode_weight_bytes(m, "mxfp4", {1, 8}, 1);
  const double none = rank_decode_weight_bytes(m, "mxfp4", {1, 8}, 0);
  EXPECT_NEAR(one_token_rank - none, 75 * expected_distinct_experts(256, 8, 8) * m.expert_bytes("mxfp4") / 8, 1.0);
}

namespace {
PlanInputs serve_inputs(int gpus, const std::string& experts, int64_t context) {
  PlanInputs in;
  in.gpu = "h200";
  in.gpus = gpus;
  in.weights = experts;
  in.context = context;
  in.concurrency = 128;
  in.reserve_fraction = 0.1;  // --gpu-memory-utilization 0.9
  return in;
}
}  // namespace

TEST(ServeMemory, TheCacheTakesTheBudgetLessWeightsWorkspacesRuntimeAndMargin) {
  const ModelSpec m = glm52();
  const PlanInputs in = serve_inputs(8, "mxfp4", 32768);
  const GpuSpec gpu = find_gpu("h200");
  const ServeMemory s = serve_memory(m, in, gpu, {1, 8}, true);
  ASSERT_TRUE(s.known);
  EXPECT_DOUBLE_EQ(s.budget, 0.9 * gpu.memory_bytes);
  EXPECT_DOUBLE_EQ(s.weights, rank_device_weight_bytes(m, "mxfp4", {1, 8}));
  const double per_token = 2.0 * 576 * 78 + 2.0 * 128 * 21;  // bf16 rows and indexer keys
  const double left = s.budget - s.weights - s.workspaces - s.runtime - s.margin;
  EXPECT_EQ(s.cache_blocks, static_cast<int64_t>(left / (per_token * 16)) - 1);  // less the idle rank's block
  EXPECT_EQ(s.cache_tokens, 16 * s.cache_blocks);
  EXPECT_DOUBLE_EQ(s.cache, (s.cache_tokens + 16) * per_token);
  EXPECT_TRUE(s.fits);
  // The indexer's scores [tokens, context] fp32 and the logits [sequences, vocab] fp32 are
  // among the workspaces.
  EXPECT_GT(s.workspaces, 4.0 * 2048 * 32768 + 4.0 * 128 * 154880);
  EXPECT_LT(s.workspaces, 8.0 * (1 << 30));
}

TEST(ServeMemory, StepLimitsExpertsAndTheMtpLayerMoveIt) {
  const ModelSpec m = glm52();
  const GpuSpec gpu = find_gpu("h200");
  PlanInputs in = serve_inputs(8, "mxfp4", 32768);
  const ServeMemory base = serve_memory(m, in, gpu, {1, 8}, true);
  in.max_num_batched_tokens = 8192;
  const ServeMemory more_tokens = serve_memory(m, in, gpu, {1, 8}, true);
  EXPECT_GT(more_tokens.workspaces, base.workspaces + 4.0 * 6144 * 32768);  // the scores at least
  EXPECT_LT(more_tokens.cache_blocks, base.cache_blocks);
  in.max_num_batched_tokens = 2048;
  in.speculative_steps = 3;
  const ServeMemory mtp = serve_memory(m, in, gpu, {1, 8}, true);
  // The MTP layer: one more MoE layer's share (32 of its experts in MXFP4, the rest bf16) and
  // one more latent row and its indexer keys per token.
  const double mtp_experts = 32.0 * m.expert_bytes("mxfp4");
  EXPECT_GT(mtp.weights - base.weights, mtp_experts);
  EXPECT_LT(mtp.weights - base.weights, mtp_experts + 4e9);
  EXPECT_LT(mtp.cache_blocks, base.cache_blocks);
  // A whole GLM-5.2 on one H200 leaves no cache.
  in.speculative_steps = 0;
  const ServeMemory one = serve_memory(m, serve_inputs(1, "mxfp4", 32768), gpu, {1, 1}, false);
  EXPECT_EQ(one.cache_blocks, 0);
  EXPECT_FALSE(one.fits);
}

TEST(ServeMemory, ExpertParallelRowsTakeTheirCacheFromItAndOtherFamiliesAreNotKnown) {
  const ModelSpec m = glm52();
  const PlanResult p = make_plan(m, serve_inputs(8, "mxfp4", 32768));
  const Layout& ep8 = p.layouts.back();
  ASSERT_TRUE(ep8.expert_parallel);
  ASSERT_EQ(ep8.dp, 8);
  EXPECT_DOUBLE_EQ(ep8.kv_room_per_replica, serve_memory(m, p.inputs, p.gpu, {1, 8}, true).cache);
  EXPECT_TRUE(p.serve.known);
  EXPECT_EQ(p.serve.tp, 8);  // the headline layout: --tp defaults to all GPUs
  const ModelSpec llama = load_model_spec(GLMS_SOURCE_DIR "/tests/plan/configs/llama-3-70b.json");
  EXPECT_FALSE(make_plan(llama, serve_inputs(4, "bf16", 8192)).serve.known);
}

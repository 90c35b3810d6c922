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
  // DP8 + EP8: per MoE layer 7 peers' rows in (bf16 rows + 8 bytes an expert) and fp32 sums out.
  const StepCollectives dp = step_collectives(m, {1, 8}, 64);
  EXPECT_DOUBLE_EQ(dp.bytes_sent, 75 * 7 * 64 * (6144 * 2.0 + 8 * 8.0 + 6144 * 4.0));
  EXPECT_EQ(dp.count, 150);
  EXPECT_DOUBLE_EQ(dp.time_s(450e9, 10e-6), 150 * 10e-6 + dp.bytes_sent / 450e9);
}

TEST(RankShape, ADecodeStepReadsTheExpertsTheWholeStepTouches) {
  const ModelSpec m = glm52();
  // Eight ranks of one token each touch what eight tokens touch, an eighth of it on each rank.
  const double one_token_rank = rank_decode_weight_bytes(m, "mxfp4", {1, 8}, 1);
  const double none = rank_decode_weight_bytes(m, "mxfp4", {1, 8}, 0);
  EXPECT_NEAR(one_token_rank - none, 75 * expected_distinct_experts(256, 8, 8) * m.expert_bytes("mxfp4") / 8, 1.0);
}

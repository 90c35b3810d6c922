// SGLang's launch_server flags (cli/sglang_flags.h): its names of glmserve's flags, its layouts
// (--enable-dp-attention counts every rank in --tp-size, --ep-size spreads the experts), EAGLE /
// NEXTN speculation as MTP drafting, and refusals that say what to type instead.
#include <gtest/gtest.h>

#include "cli/sglang_flags.h"
#include "core/error.h"

using namespace glms;
using cli::SglangFlags;
using cli::SglangLayout;

namespace {

const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";

// The message of the glms::Error resolving `flags` over `layout` throws ("" when none).
std::string refusal(const SglangFlags& flags, SglangLayout layout = {}) {
  try {
    cli::resolve_sglang_flags(flags, kModel, 16, layout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SglangFlagsResolve, DataParallelAttentionCountsEveryRankInTpSize) {
  SglangFlags flags;
  flags.enable_dp_attention = true;
  flags.ep_size = 8;
  SglangLayout layout{8, 8, false};  // --tp 8 --dp 8 --enable-dp-attention --ep 8: eight GPUs
  const cli::SglangSettings s = cli::resolve_sglang_flags(flags, kModel, 16, layout);
  EXPECT_EQ(layout.tensor_parallel, 1);
  EXPECT_EQ(layout.data_parallel, 8);
  EXPECT_TRUE(layout.expert_parallel);
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_NE(s.notes[0].find("8 ranks, attention in 8 data-parallel groups of 1"), std::string::npos) << s.notes[0];
  SglangLayout tp4_dp2{8, 2, false};  // the write-up's TP4 x DP2 on eight GPUs
  cli::resolve_sglang_flags(flags, kModel, 16, tp4_dp2);
  EXPECT_EQ(tp4_dp2.tensor_parallel, 4);
  EXPECT_TRUE(tp4_dp2.expert_parallel);
  EXPECT_NE(refusal(flags, {8, 3, false}).find("not a multiple of --dp-size 3"), std::string::npos);
  // Without DP attention SGLang's expert group is a replica's --tp-size: --tp 4 --dp 2 --ep 4 spreads
  // whole experts (over all eight ranks here, with a note); another size is refused.
  SglangFlags replicas;
  replicas.ep_size = 4;
  SglangLayout tp4_replicas{4, 2, false};
  const cli::SglangSettings r = cli::resolve_sglang_flags(replicas, kModel, 16, tp4_replicas);
  EXPECT_EQ(tp4_replicas.tensor_parallel, 4);
  EXPECT_TRUE(tp4_replicas.expert_parallel);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("spread over all 8 ranks"), std::string::npos) << r.notes[0];
  EXPECT_NE(refusal(replicas, {8, 1, false}).find("takes --ep-size 8 (--tp-size)"), std::string::npos)
      << refusal(replicas, {8, 1, false});
  SglangFlags one;
  one.ep_size = 1;
  EXPECT_NE(refusal(one, {2, 1, true}).find("disagree"), std::string::npos);
  // --dp-size alone: glmserve's own data-parallel groups, nothing to say.
  SglangLayout plain{1, 4, true};
  EXPECT_TRUE(cli::resolve_sglang_flags(SglangFlags{}, kModel, 16, plain).notes.empty());
}

TEST(SglangFlagsResolve, EagleAndNextnDraftWithTheMtpLayer) {
  SglangFlags flags;
  flags.speculative_algorithm = "EAGLE";
  flags.speculative_num_steps = 5;
  flags.speculative_eagle_topk = 1;
  flags.speculative_num_draft_tokens = 6;  // the write-up's 5 / 1 / 6
  SglangLayout layout;
  EXPECT_EQ(cli::resolve_sglang_flags(flags, kModel, 16, layout).speculative_steps, 5);
  SglangFlags nextn;
  nextn.speculative_algorithm = "nextn";
  nextn.speculative_draft_model_path = kModel;
  EXPECT_EQ(cli::resolve_sglang_flags(nextn, kModel, 16, layout).speculative_steps, 3);
  nextn.speculative_num_draft_tokens = 6;  // the steps follow from the draft tokens
  EXPECT_EQ(cli::resolve_sglang_flags(nextn, kModel, 16, layout).speculative_steps, 5);
  const std::pair<void (*)(SglangFlags&), std::string> refused[] = {
      {[](SglangFlags& f) { f.speculative_algorithm = "EAGLE3"; }, "MTP layer only"},
      {[](SglangFlags& f) { f.speculative_eagle_topk = 4; }, "a chain of tokens, not a tree"},
      {[](SglangFlags& f) { f.speculative_num_draft_tokens = 4; }, "--speculative-num-draft-tokens 6"},
      {[](SglangFlags& f) { f.speculative_draft_model_path = "/models/draft"; }, "separate draft model"},
      {[](SglangFlags& f) { f.speculative_algorithm.clear(); }, "go with --speculative-algorithm EAGLE"},
      {[](SglangFlags& f) { f.dist_init_addr = "10.0.0.1:5000"; }, "under mpirun"},
  };
  for (const auto& [change, expect] : refused) {
    SglangFlags f = flags;
    change(f);
    EXPECT_NE(refusal(f).find(expect), std::string::npos) << refusal(f);
  }
}

TEST(SglangFlagsResolve, ChunkedPrefillSizeBoundsTheStep) {
  SglangFlags flags;
  flags.chunked_prefill_size = 8192;
  SglangLayout layout;
  EXPECT_EQ(cli::resolve_sglang_flags(flags, kModel, 16, layout).max_batch_tokens, 8192);
  flags.chunked_prefill_size = -1;  // SGLang's "no chunking": glmserve keeps its step bound, with a note
  const cli::SglangSettings s = cli::resolve_sglang_flags(flags, kModel, 16, layout);
  EXPECT_EQ(s.max_batch_tokens, 0);
  EXPECT_EQ(s.notes.size(), 1u);
  flags.chunked_prefill_size = -5;
  EXPECT_NE(refusal(flags).find("expects tokens a step, or -1"), std::string::npos);
}

TEST(SglangFlagsResolve, KernelBackendsAndPagesLeaveNotes) {
  SglangFlags flags;
  flags.attention_backend = "fa3";
  flags.nsa_decode_backend = "flashmla_kv";
  flags.moe_a2a_backend = "deepep";
  flags.page_size = 64;
  flags.enable_metrics = true;
  SglangLayout layout;
  EXPECT_EQ(cli::resolve_sglang_flags(flags, kModel, 16, layout).notes.size(), 5u);
  flags = SglangFlags{};
  flags.page_size = 16;
  EXPECT_TRUE(cli::resolve_sglang_flags(flags, kModel, 16, layout).notes.empty());
}

TEST(SglangFlagsResolve, FlagsWithNothingToSetAreNotedOrRefusedSayingWhy) {
  SglangFlags flags;
  flags.nothing_to_set["--watchdog-timeout"] = {"1000"};
  flags.nothing_to_set["--enable-torch-compile"] = {};
  flags.nothing_to_set["--cuda-graph-bs"] = {"1", "2", "4"};
  SglangLayout layout;
  const cli::SglangSettings s = cli::resolve_sglang_flags(flags, kModel, 16, layout);
  ASSERT_EQ(s.notes.size(), 3u);
  EXPECT_EQ(s.notes[0].rfind("--watchdog-timeout 1000: no watchdog", 0), 0u) << s.notes[0];  // the table's order
  EXPECT_EQ(s.notes[1].rfind("--cuda-graph-bs 1 2 4: ", 0), 0u) << s.notes[1];
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--enable-deterministic-inference", {}}, {"--tool-server", {"demo"}}, {"--lora-paths", {"a=/b"}}}) {
    SglangFlags one;
    one.nothing_to_set[flag] = value;
    const std::string message = refusal(one);
    EXPECT_EQ(message.rfind(flag, 0), 0u) << flag << ": " << message;
  }
}

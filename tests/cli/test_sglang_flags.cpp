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

TEST(SglangArguments, ServesFlagsTakeGlmservesNames) {
  const std::vector<std::string> sglang = {"glmserve", "serve", "--model-path", "DIR", "--tp-size", "8", "--dp=2",
                                           "--context-length", "32768", "--chunked-prefill-size", "8192",
                                           "--max-running-requests", "64", "--mem-fraction-static", "0.85",
                                           "--random-seed", "3", "--disable-radix-cache", "--disable-cuda-graph"};
  EXPECT_EQ(cli::normalize_sglang_arguments(sglang),
            (std::vector<std::string>{"glmserve", "serve", "--model", "DIR", "--tensor-parallel-size", "8",
                                      "--data-parallel-size=2", "--max-model-len", "32768", "--max-num-batched-tokens",
                                      "8192", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.85", "--seed",
                                      "3", "--no-enable-prefix-caching", "--enforce-eager"}));
  // Other subcommands keep their own flags (bench has a --seed of its own, generate no --tp).
  const std::vector<std::string> bench = {"glmserve", "bench", "--random-seed", "3"};
  EXPECT_EQ(cli::normalize_sglang_arguments(bench), bench);
}

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
  SglangFlags ep_only;
  ep_only.ep_size = 4;
  EXPECT_NE(refusal(ep_only, {8, 1, false}).find("every rank of the layout, 8 here"), std::string::npos);
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

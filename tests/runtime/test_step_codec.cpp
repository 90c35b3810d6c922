// The multi-node control messages: a step's row outputs survive the trip with their token masks
// (RowOutput::mask, structured outputs; a mask made on demand is made before it travels), rows
// without one arrive without one, and every rank's data-parallel peers arrive as sent.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/step_codec.h"

using namespace glms;

TEST(StepCodec, RowOutputsKeepTheirTokenMasks) {
  std::vector<runtime::RankStep> steps(2);
  steps[0].batch.add_sequence({5, 6, 7}, 0, {3}, 16, false);  // two logits rows
  steps[0].batch.add_sequence({8}, 0, {4}, 16, false);
  steps[0].outputs.resize(2);
  steps[0].outputs[0].mask = std::make_shared<const std::vector<uint32_t>>(std::vector<uint32_t>{0x1u, 0x80000000u, 7u});
  model::RowOutput& sampled = steps[0].outputs[1];
  sampled.kind = model::RowOutput::Kind::kSample;
  sampled.temperature = 0.7f;
  sampled.top_k = 40;
  sampled.top_p = 0.9f;
  sampled.min_p = 0.05f;
  sampled.canonical = 0.123456789;
  steps[1].batch.add_sequence({9}, 4, {1}, 16, false);
  steps[1].outputs.resize(1);
  steps[1].outputs[0].kind = model::RowOutput::Kind::kLogits;
  model::set_data_parallel_peers({&steps[0].batch, &steps[1].batch});

  runtime::ByteWriter out;
  runtime::write_steps(out, steps, 0);
  runtime::ByteReader in(out.bytes);
  std::vector<std::vector<float>> h_prev;
  const std::vector<runtime::RankStep> back = runtime::read_steps(in, 0, h_prev);
  ASSERT_EQ(back.size(), 2u);
  ASSERT_EQ(back[0].outputs.size(), 2u);
  ASSERT_NE(back[0].outputs[0].mask, nullptr);
  EXPECT_EQ(*back[0].outputs[0].mask, *steps[0].outputs[0].mask);
  EXPECT_EQ(back[0].outputs[0].kind, model::RowOutput::Kind::kArgmax);
  const model::RowOutput& s = back[0].outputs[1];
  EXPECT_EQ(s.kind, model::RowOutput::Kind::kSample);
  EXPECT_EQ(s.mask, nullptr);
  EXPECT_EQ(s.temperature, 0.7f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.canonical, 0.123456789);
  ASSERT_EQ(back[1].outputs.size(), 1u);
  EXPECT_EQ(back[1].outputs[0].kind, model::RowOutput::Kind::kLogits);
  EXPECT_EQ(back[1].outputs[0].mask, nullptr);
  EXPECT_EQ(back[1].batch.token_ids, steps[1].batch.token_ids);
  EXPECT_EQ(back[0].batch.logits_tokens, steps[0].batch.logits_tokens);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(back[r].batch.dp_peers.size(), 2u);
    EXPECT_EQ(back[r].batch.dp_peers, steps[r].batch.dp_peers);
  }
  EXPECT_EQ(back[0].batch.dp_peers[1], (model::DpStepShape{1, 1, 1, 5, 1}));
}

TEST(StepCodec, AMaskMadeOnDemandTravelsAsItsWords) {
  std::vector<runtime::RankStep> steps(1);
  steps[0].batch.add_sequence({5}, 0, {3}, 16, false);
  steps[0].outputs.resize(1);
  int calls = 0;
  steps[0].outputs[0].mask_source_words = 3;
  steps[0].outputs[0].mask_source = [&calls](uint32_t* words) {
    ++calls;
    words[0] = 0x10u, words[1] = 0u, words[2] = 0x4u;
  };
  runtime::ByteWriter out;
  runtime::write_steps(out, steps, 0);
  EXPECT_EQ(calls, 1);
  runtime::ByteReader in(out.bytes);
  std::vector<std::vector<float>> h_prev;
  const std::vector<runtime::RankStep> back = runtime::read_steps(in, 0, h_prev);
  ASSERT_EQ(back.size(), 1u);
  ASSERT_NE(back[0].outputs[0].mask, nullptr);
  EXPECT_EQ(*back[0].outputs[0].mask, (std::vector<uint32_t>{0x10u, 0u, 0x4u}));
}

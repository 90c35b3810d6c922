// Data-parallel peers of a step (model/batch.h): every rank's batch learns every rank's sizes, and
// the decision to run a decode step as a CUDA graph, with its key, comes out the same on every
// rank (a captured NCCL collective must be captured on every rank of its group, and a graph
// replayed only together with the graphs of the same joint capture).
#include <gtest/gtest.h>

#include <vector>

#include "model/batch.h"

using namespace glms;
using model::DpStepShape;
using model::ForwardBatch;

namespace {

constexpr int kBlock = 16;
constexpr int kIndexTopk = 64;

// A batch of decoding sequences, one token each, at the given context lengths.
ForwardBatch decoding(const std::vector<int>& contexts) {
  ForwardBatch b;
  for (size_t s = 0; s < contexts.size(); ++s) {
    std::vector<int32_t> table((contexts[s] + kBlock - 1) / kBlock);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(100 * s + i);
    b.add_sequence({static_cast<int32_t>(7 + s)}, contexts[s] - 1, table, kBlock, false);
  }
  return b;
}

std::vector<DpStepShape> peers_of(std::vector<ForwardBatch>& batches) {
  std::vector<ForwardBatch*> pointers;
  for (ForwardBatch& b : batches) pointers.push_back(&b);
  model::set_data_parallel_peers(pointers);
  for (const ForwardBatch& b : batches) EXPECT_EQ(b.dp_peers, batches[0].dp_peers);
  return batches[0].dp_peers;
}

}  // namespace

TEST(DataParallelPeers, EveryRankLearnsEveryRanksSizesAndTokens) {
  std::vector<ForwardBatch> batches = {decoding({10, 40}), ForwardBatch(), decoding({5})};
  batches[1].add_sequence({1, 2, 3, 4}, 0, {9}, kBlock, true);  // a prefill chunk, logits for each token
  const std::vector<DpStepShape> peers = peers_of(batches);
  ASSERT_EQ(peers.size(), 3u);
  EXPECT_EQ(peers[0], (DpStepShape{2, 2, 2, 40, 1}));
  EXPECT_EQ(peers[1], (DpStepShape{4, 1, 4, 4, 4}));
  EXPECT_EQ(peers[2], (DpStepShape{1, 1, 1, 5, 1}));
  EXPECT_EQ(batches[2].dp_tokens(), (std::vector<int32_t>{2, 4, 1}));
}

TEST(DataParallelPeers, OneRankPrefillingKeepsEveryRankOffTheGraph) {
  std::vector<ForwardBatch> decode = {decoding({10, 40}), ForwardBatch(), decoding({5})};  // rank 1 idle
  EXPECT_TRUE(model::every_dp_peer_fits_a_graph(peers_of(decode)));
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(decode)), 1);
  std::vector<ForwardBatch> mixed = {decoding({10, 40}), ForwardBatch(), decoding({5})};
  mixed[1].add_sequence({1, 2, 3}, 0, {9}, kBlock, false);
  // A short chunk without a logits row for each token is a one-off shape: no graph.
  EXPECT_FALSE(model::every_dp_peer_fits_a_graph(peers_of(mixed)));
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(mixed)), 0);
}

TEST(DataParallelPeers, VerifyStepsFitAGraphAndPrefillChunksDoNot) {
  // A peer verifying MTP drafts (the pending token and up to 7 drafts a sequence) beside decoding
  // and idle ranks: every rank takes the graph, unpadded (not every rank decodes).
  std::vector<ForwardBatch> verifying = {decoding({10, 40}), ForwardBatch(), decoding({5})};
  std::vector<int32_t> verify(model::kGraphedSequenceTokens);
  for (int i = 0; i < model::kGraphedSequenceTokens; ++i) verify[i] = 3 + i;
  verifying[2].add_sequence(verify, 5, {8}, kBlock, true);
  const std::vector<DpStepShape> peers = peers_of(verifying);
  EXPECT_EQ(peers[2].max_sequence_tokens, model::kGraphedSequenceTokens);
  EXPECT_TRUE(model::every_dp_peer_fits_a_graph(peers));
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers), 0) << "decodes beside a verify: not padded";
  // One token more in one sequence of one rank is a prefill chunk: no rank takes a graph.
  std::vector<ForwardBatch> chunk = {decoding({10, 40}), ForwardBatch(), decoding({5})};
  verify.push_back(99);
  chunk[2].add_sequence(verify, 5, {8}, kBlock, false);
  EXPECT_FALSE(model::every_dp_peer_fits_a_graph(peers_of(chunk)));
}

TEST(DataParallelPeers, TheGraphKeyChangesWithAnyRanksLaunchesAndOnlyWithThem) {
  std::vector<ForwardBatch> first = {decoding({10, 40}), decoding({5})};
  const std::vector<int32_t> key = model::dp_graph_key(peers_of(first), kIndexTopk);
  // Contexts that grow on the same side of the indexer's top-k replay the same graphs.
  std::vector<ForwardBatch> later = {decoding({11, 41}), decoding({30})};
  EXPECT_EQ(model::dp_graph_key(peers_of(later), kIndexTopk), key);
  // Another rank's sequence count, or its context passing the top-k (its indexer then scores),
  // changes every rank's key, this rank's batch unchanged.
  std::vector<ForwardBatch> more = {decoding({10, 40}), decoding({5, 6})};
  EXPECT_NE(model::dp_graph_key(peers_of(more), kIndexTopk), key);
  std::vector<ForwardBatch> longer = {decoding({10, 40}), decoding({kIndexTopk + 1})};
  EXPECT_NE(model::dp_graph_key(peers_of(longer), kIndexTopk), key);
  std::vector<ForwardBatch> idle = {decoding({10, 40}), ForwardBatch()};
  EXPECT_NE(model::dp_graph_key(peers_of(idle), kIndexTopk), key);
}

TEST(DataParallelPeers, RanksOfAsManyTokensASequenceArePadded) {
  std::vector<ForwardBatch> decode = {decoding({10, 40}), ForwardBatch(), decoding({5})};
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(decode)), 1);
  std::vector<ForwardBatch> idle = {ForwardBatch(), ForwardBatch()};
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(idle)), 1);
  // Four tokens a sequence with a logits row each (three drafts verified) on every busy rank.
  std::vector<ForwardBatch> verify(3);
  verify[0].add_sequence({1, 2, 3, 4}, 9, {0}, kBlock, true);
  verify[0].add_sequence({5, 6, 7, 8}, 3, {1}, kBlock, true);
  verify[2].add_sequence({1, 2, 3, 4}, 0, {2}, kBlock, true);
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(verify)), 4);
  // A rank whose sequences differ in tokens, or without a row for each token: not padded.
  std::vector<ForwardBatch> uneven = verify;
  uneven[2].add_sequence({1, 2}, 0, {3}, kBlock, true);
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(uneven)), 0);
  std::vector<ForwardBatch> last_rows = verify;
  last_rows[2] = ForwardBatch();
  last_rows[2].add_sequence({1, 2, 3, 4}, 0, {2}, kBlock, false);
  EXPECT_EQ(model::uniform_dp_sequence_tokens(peers_of(last_rows)), 0);
}

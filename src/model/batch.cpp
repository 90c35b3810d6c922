#include "model/batch.h"

#include <algorithm>

#include "core/error.h"

namespace glms::model {

void ForwardBatch::add_sequence(const std::vector<int32_t>& tokens, int start,
                                const std::vector<int32_t>& block_table, int block_size, bool all_logits) {
  GLMS_CHECK(!tokens.empty(), "a sequence in a batch needs at least one token");
  SequenceSlice slice;
  slice.first_token = num_tokens();
  slice.num_tokens = static_cast<int>(tokens.size());
  slice.context_len = start + slice.num_tokens;
  slice.block_table = block_table;
  GLMS_CHECK(static_cast<int64_t>(block_table.size()) * block_size >= slice.context_len,
             "block table too short for the sequence's context");
  const int seq_index = static_cast<int>(sequences.size());
  for (int i = 0; i < slice.num_tokens; ++i) {
    const int position = start + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(position);
    slot_mapping.push_back(static_cast<int64_t>(block_table[position / block_size]) * block_size +
                           position % block_size);
    token_sequence.push_back(seq_index);
    if (all_logits || i == slice.num_tokens - 1) logits_tokens.push_back(slice.first_token + i);
  }
  sequences.push_back(std::move(slice));
}

std::vector<int32_t> ForwardBatch::dp_tokens() const {
  std::vector<int32_t> tokens;
  tokens.reserve(dp_peers.size());
  for (const DpStepShape& peer : dp_peers) tokens.push_back(peer.tokens);
  return tokens;
}

DpStepShape dp_step_shape(const ForwardBatch& batch) {
  DpStepShape shape;
  shape.tokens = batch.num_tokens();
  shape.sequences = static_cast<int32_t>(batch.sequences.size());
  shape.logits = static_cast<int32_t>(batch.logits_tokens.size());
  for (int32_t p : batch.positions) shape.max_context = std::max(shape.max_context, p + 1);
  for (const SequenceSlice& seq : batch.sequences)
    shape.max_sequence_tokens = std::max(shape.max_sequence_tokens, static_cast<int32_t>(seq.num_tokens));
  return shape;
}

void set_data_parallel_peers(const std::vector<ForwardBatch*>& batches) {
  std::vector<DpStepShape> peers;
  peers.reserve(batches.size());
  for (const ForwardBatch* batch : batches) peers.push_back(dp_step_shape(*batch));
  for (ForwardBatch* batch : batches) batch->dp_peers = peers;
}

bool every_dp_peer_fits_a_graph(const std::vector<DpStepShape>& peers) {
  return std::all_of(peers.begin(), peers.end(), [](const DpStepShape& p) { return p.fits_a_graph(); });
}

int uniform_dp_sequence_tokens(const std::vector<DpStepShape>& peers) {
  int n = 0;
  for (const DpStepShape& p : peers) {
    if (p.tokens == 0) continue;  // idle
    const int tokens = p.max_sequence_tokens;
    if (tokens > kGraphedSequenceTokens || p.tokens != tokens * p.sequences || p.logits != p.tokens) return 0;
    if (n != 0 && tokens != n) return 0;
    n = tokens;
  }
  return n == 0 ? 1 : n;
}

std::vector<int32_t> dp_graph_key(const std::vector<DpStepShape>& peers, int index_topk) {
  std::vector<int32_t> key;
  key.reserve(4 * peers.size());
  for (const DpStepShape& p : peers) key.insert(key.end(), {p.tokens, p.sequences, p.logits, p.max_context <= index_topk});
  return key;
}

std::shared_ptr<const std::vector<uint32_t>> RowOutput::resolved_mask() const {
  if (mask || !mask_source) return mask;
  auto words = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(mask_source_words), 0u);
  mask_source(words->data());
  return words;
}

}  // namespace glms::model

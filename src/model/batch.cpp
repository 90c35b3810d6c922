#include "model/batch.h"

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

std::shared_ptr<const std::vector<uint32_t>> RowOutput::resolved_mask() const {
  if (mask || !mask_source) return mask;
  auto words = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(mask_source_words), 0u);
  mask_source(words->data());
  return words;
}

}  // namespace glms::model

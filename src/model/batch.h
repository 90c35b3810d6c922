// Everything one forward step needs to know about its batch, in one explicit struct: which
// tokens, at which positions, where each writes its cache row, how each sequence's context is
// laid out in the paged cache, and which tokens need logits. Tokens of one sequence are
// contiguous and in position order; a sequence may contribute a prefill chunk or one decode
// token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace glms::model {

struct SequenceSlice {
  int first_token = 0;               // index of its first token in ForwardBatch::token_ids
  int num_tokens = 0;                // tokens of this sequence in this step
  int context_len = 0;               // cached tokens after this step (positions 0..context_len-1)
  std::vector<int32_t> block_table;  // physical block of each logical block of the context
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] position of each token in its sequence
  std::vector<int64_t> slot_mapping;  // [num_tokens] cache slot each token's rows are written to
  std::vector<int32_t> token_sequence;  // [num_tokens] index into `sequences`
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logits_tokens;  // token indices whose logits are returned, in order

  int num_tokens() const { return static_cast<int>(token_ids.size()); }

  // Appends a sequence whose `tokens` occupy positions [start, start + tokens.size()) and whose
  // context lives in `block_table` (blocks of `block_size`). With `all_logits`, every token's
  // logits are returned; otherwise only the last token's.
  void add_sequence(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_table,
                    int block_size, bool all_logits);
};

// A step's logits as its caller asked for them: every logits row's argmax (greedy decoding's
// token; lowest index on ties) and the full rows of those asked for, so that a device runner
// copies a few bytes back for a greedy row instead of a vocabulary of fp32.
struct StepLogits {
  int vocab_size = 0;
  std::vector<int32_t> argmax;    // [logits rows]
  std::vector<int32_t> full_row;  // [logits rows]: the row's index in `full`, -1 if not asked for
  std::vector<float> full;        // [rows asked for, vocab_size] fp32, in logits row order

  // Row i's logits, or nullptr where only its argmax came back.
  const float* row(size_t i) const {
    return full_row[i] < 0 ? nullptr : full.data() + static_cast<int64_t>(full_row[i]) * vocab_size;
  }
};

}  // namespace glms::model

// Everything one forward step needs to know about its batch, in one explicit struct: which
// tokens, at which positions, where each writes its cache row, how each sequence's context is
// laid out in the paged cache, and which tokens need logits. Tokens of one sequence are
// contiguous and in position order; a sequence may contribute a prefill chunk or one decode
// token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace glms::model {

struct SequenceSlice {
  int first_token = 0;               // index of its first token in ForwardBatch::token_ids
  int num_tokens = 0;                // tokens of this sequence in this step
  int context_len = 0;               // cached tokens after this step (positions 0..context_len-1)
  std::vector<int32_t> block_table;  // physical block of each logical block of the context
};

// The most tokens a sequence may have in a step that runs as a CUDA graph: a decode step (one a
// sequence) or an MTP verify step (the pending token and up to 7 drafts). Every token of such a
// step attends and scores its keys on its own, so the step's launches follow from its sizes.
constexpr int kGraphedSequenceTokens = 8;

// One data-parallel rank's step as its peers see it: its sizes, which fix the launches of a
// decode or verify step on a device.
struct DpStepShape {
  int32_t tokens = 0;       // 0: an idle rank (it runs one dummy token, so as to join the MoE gathers)
  int32_t sequences = 0;
  int32_t logits = 0;       // logits rows
  int32_t max_context = 0;  // the largest position of its tokens + 1 (0 when idle)
  int32_t max_sequence_tokens = 0;  // the most tokens of one of its sequences (0 when idle)
  // A decode or verify step: a few tokens a sequence, and one token a sequence or a logits row a
  // token (a short prefill chunk without a row for each token runs eager, a one-off shape).
  bool fits_a_graph() const {
    return max_sequence_tokens <= kGraphedSequenceTokens && (tokens == sequences || logits == tokens);
  }
  bool operator==(const DpStepShape&) const = default;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] position of each token in its sequence
  std::vector<int64_t> slot_mapping;  // [num_tokens] cache slot each token's rows are written to
  std::vector<int32_t> token_sequence;  // [num_tokens] index into `sequences`
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logits_tokens;  // token indices whose logits are returned, in order
  // Data-parallel attention: every data-parallel rank's step ([dp_size], this rank's among them;
  // set_data_parallel_peers): the MoE layers gather their tokens, and a device runner takes a
  // decode step's graph only where every rank does; empty without data-parallel peers.
  std::vector<DpStepShape> dp_peers;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  // The tokens of each data-parallel rank (dp_peers' counts).
  std::vector<int32_t> dp_tokens() const;

  // Appends a sequence whose `tokens` occupy positions [start, start + tokens.size()) and whose
  // context lives in `block_table` (blocks of `block_size`). With `all_logits`, every token's
  // logits are returned; otherwise only the last token's.
  void add_sequence(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_table,
                    int block_size, bool all_logits);
};

// This batch's sizes as a data-parallel peer sees them.
DpStepShape dp_step_shape(const ForwardBatch& batch);

// Gives every batch of one step (one a data-parallel rank, in rank order) every rank's shape.
void set_data_parallel_peers(const std::vector<ForwardBatch*>& batches);

// A data-parallel decode or verify step as a CUDA graph. A captured NCCL collective must be
// captured on every rank of its group, and a graph replayed only where every rank replays the
// graph of the same joint capture: so a rank takes a graph only where every rank's step fits one
// (every_dp_peer_fits_a_graph), and keys it by every rank's shape (each rank's sizes, and whether
// all its tokens' contexts fit the indexer's top-k, which changes its launches): the same step
// gives every rank the same key. Where every rank decodes, or verifies as many drafts a
// sequence, a rank pads its batch to the largest (uniform_dp_sequence_tokens), so that one graph
// serves every mix of smaller batches.
bool every_dp_peer_fits_a_graph(const std::vector<DpStepShape>& peers);
// n where every rank that runs anything runs n tokens a sequence, a logits row each, n at most
// kGraphedSequenceTokens (decode: 1; MTP verify of K drafts: K + 1; every rank idle: 1); else 0.
// Such steps are padded to the largest rank's sequences for their graphs.
int uniform_dp_sequence_tokens(const std::vector<DpStepShape>& peers);
std::vector<int32_t> dp_graph_key(const std::vector<DpStepShape>& peers, int index_topk);

// What a step returns for one logits row (StepRunner::forward_selected).
struct RowOutput {
  enum class Kind : uint8_t {
    kArgmax,  // the row's argmax (greedy decoding)
    kLogits,  // the whole row besides (penalties, logprobs, verifying sampled drafts)
    kSample,  // a token drawn where the logits are: ops::sample_row with the fields below
  };
  Kind kind = Kind::kArgmax;
  float temperature = 1.0f;  // kSample: ops::SamplingFilter's fields (temperature > 0)
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double canonical = 0.0;  // kSample: the uniform draw in [0, 1)
  // Optional, any kind: the tokens the row may produce (structured outputs), [(vocab + 31) / 32]
  // words, bit t % 32 of word t / 32 set where token t is allowed. Every other logit of the row
  // is -infinity before its argmax, draw or copy; allowed ones keep their values bit for bit.
  // The CUDA runner applies it on the device (ops::cuda::apply_token_masks), the default
  // forward_selected on the host (select_logits).
  std::shared_ptr<const std::vector<uint32_t>> mask = nullptr;
  // Or the same mask made on demand: mask_source fills mask_source_words words (every one). A
  // runner calls it once, where the step's forward is already on its way (the CUDA runner: after
  // launching it), so that the host's work on masks (a structured output's new grammar state
  // walks the vocabulary's trie) overlaps the device's. A row has mask or mask_source, not both.
  std::function<void(uint32_t* words)> mask_source;
  int32_t mask_source_words = 0;

  bool has_mask() const { return mask != nullptr || static_cast<bool>(mask_source); }
  // The mask as words (made by mask_source where the row has one); null without a mask.
  std::shared_ptr<const std::vector<uint32_t>> resolved_mask() const;
};

// A step's logits as its caller asked for them: a token for every row (its argmax, or its draw
// for kSample rows) and the full rows of kLogits, so that a device runner copies a few bytes
// back for most rows instead of a vocabulary of fp32.
struct StepLogits {
  int vocab_size = 0;
  std::vector<int32_t> token;     // [logits rows]
  std::vector<int32_t> full_row;  // [logits rows]: the row's index in `full`, -1 if not asked for
  std::vector<float> full;        // [kLogits rows, vocab_size] fp32, in logits row order

  // Row i's logits, or nullptr where only its token came back.
  const float* row(size_t i) const {
    return full_row[i] < 0 ? nullptr : full.data() + static_cast<int64_t>(full_row[i]) * vocab_size;
  }
};

}  // namespace glms::model

// Next-token choice from fp32 logits: greedy at temperature 0, otherwise temperature, top-k,
// top-p and min-p filtering (vLLM's order; ops::sample_row) and a draw from a seeded generator.
#pragma once

#include <cstdint>
#include <random>

#include "model/batch.h"
#include "ops/ops.h"

namespace glms::engine {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]
  uint64_t seed = 0;
};

// The outcome of verifying drafted tokens: how many drafts stand, and the token after them.
struct DraftVerdict {
  int accepted = 0;
  int32_t next = 0;
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  int32_t sample(const float* logits, int vocab_size, const SamplingParams& params);
  // The next uniform draw in [0, 1) of this sampler's generator: what sample() passes to
  // ops::sample_row, so that a draw made elsewhere (on the device) follows the same seed.
  double canonical();
  // What a step returns for the row this sampler draws its next token from, so that the runner
  // draws it where the logits are: the argmax at temperature 0, else the filters and the next
  // uniform value (the same token sample() would draw from that row).
  model::RowOutput next_row_output(const SamplingParams& params);

  // The distribution sample() draws from, dense: probs[vocab_size] (zero where filtered out; one-hot
  // on the argmax at temperature 0).
  static void probabilities(const float* logits, int vocab_size, const SamplingParams& params, float* probs);
  // A draw from a dense distribution (it need not sum to exactly one).
  int32_t sample_from(const float* probs, int vocab_size);

  // Speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Draft k was drawn from
  // draft_probs[k] ([num_drafts, vocab]); target_probs ([num_drafts + 1, vocab]) are the
  // target's distributions after the prefix and each draft. Draft k stands with probability
  // min(1, p_k(d_k) / q_k(d_k)); at the first rejection the next token is drawn from
  // max(0, p_k - q_k) renormalised, and when every draft stands from p_K. The emitted tokens are
  // then distributed exactly as tokens drawn one at a time from the target; with one-hot
  // (greedy) distributions this is accept-while-equal-to-the-argmax.
  DraftVerdict verify_drafts(const int32_t* drafts, int num_drafts, const float* draft_probs, const float* target_probs,
                             int vocab_size);

 private:
  std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties).
using ops::argmax;

}  // namespace glms::engine

// MTP speculative decoding for one request.
//
// The MTP layer's entry at position j pairs the target's pre-norm hidden state h_j with the
// token at j + 1 and predicts the token at j + 2; it attends over its own one-layer latent
// cache of earlier entries. Each step:
//   1. draft: run the MTP layer over the entries the last step verified (their rows in the MTP
//      cache are rewritten with the target's hidden states), draw d1 from its distribution
//      (the request's temperature, top-k, top-p and min-p applied), then chain: entry (MTP
//      output hidden, d_k) at the next position gives d_{k+1};
//   2. verify: one target forward over [t_n, d1 .. dK] gives the target's distribution after
//      each; Sampler::verify_drafts keeps drafts by speculative rejection sampling and draws
//      the token after the last one kept. Rejected positions need no rollback: cache rows are
//      addressed by position and rewritten before anything reads them.
// Greedy (temperature 0) distributions are one-hot, so every emitted token is the target's own
// argmax given the true prefix; the CPU forward is batch-invariant, so the output equals plain
// greedy decoding token for token. Sampled output follows the target's distribution exactly.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/generate_steps.h"

namespace glms::engine {

namespace {

// Greedy drafts stand while they equal the target's argmax over the verify batch (verify_drafts on
// one-hot rows); the next token is the target's argmax after the last one standing.
DraftVerdict verify_greedy(model::StepRunner& target, const model::ForwardBatch& batch,
                           const std::vector<int32_t>& drafts, model::ForwardTrace* trace) {
  const int K = static_cast<int>(drafts.size());
  const model::StepLogits rows = target.forward_selected(batch, std::vector<model::RowOutput>(K + 1), trace);
  DraftVerdict verdict;
  while (verdict.accepted < K && drafts[verdict.accepted] == rows.token[verdict.accepted]) ++verdict.accepted;
  verdict.next = rows.token[verdict.accepted];
  return verdict;
}

// Sampled drafts by rejection sampling: the target's distributions over the verify batch
// (into target_probs, [K + 1, vocab]) against the drafts' (draft_probs, [K, vocab]).
DraftVerdict verify_sampled(model::StepRunner& target, const model::ForwardBatch& batch,
                            const std::vector<int32_t>& drafts, const std::vector<float>& draft_probs,
                            const GenerateOptions& options, Sampler& sampler, std::vector<float>& target_probs,
                            model::ForwardTrace* trace) {
  const int K = static_cast<int>(drafts.size());
  const int vocab = target.config().vocab_size;
  const auto verify_logits = target.forward(batch, trace);
  for (int k = 0; k <= K; ++k)
    Sampler::probabilities(verify_logits.data() + static_cast<int64_t>(k) * vocab, vocab, options.sampling,
                           target_probs.data() + static_cast<int64_t>(k) * vocab);
  return sampler.verify_drafts(drafts.data(), K, draft_probs.data(), target_probs.data(), vocab);
}

// The pending MTP entries of a speculative step and where they stand.
struct MtpEntries {
  int start = 0;                // position of the first entry
  std::vector<int32_t> tokens;  // the token after each entry
  std::vector<float> hidden;    // [entries, hidden]: the target's h_j of each entry
};

// Step 1 of a speculative step: K drafts from the MTP layer. The pending entries run first
// (after the prompt they are as many as its tokens, so in pieces no longer than a prefill chunk,
// the runner's max_tokens; only the last piece's last row drafts d1), then the chain d2 .. dK,
// each from the MTP output hidden state before it. `draft_step(batch, h_prev, h_out, k)` runs one
// MTP forward and returns draft k (k < 0: no draft wanted). `context`: the target positions in
// the cache.
template <typename DraftStep>
std::vector<int32_t> draft_tokens(const DraftStep& draft_step, const MtpEntries& entries, int64_t hidden,
                                  int context, int K, const std::vector<int32_t>& table,
                                  const GenerateOptions& options) {
  std::vector<int32_t> drafts;
  std::vector<float> chain_hidden;
  const size_t piece = static_cast<size_t>(std::max(1, options.prefill_chunk));
  for (size_t start = 0; start < entries.tokens.size(); start += piece) {
    const size_t end = std::min(entries.tokens.size(), start + piece);
    model::ForwardBatch batch;
    batch.add_sequence(std::vector<int32_t>(entries.tokens.begin() + start, entries.tokens.begin() + end),
                       entries.start + static_cast<int>(start), table, options.block_size, false);
    const int32_t draft = draft_step(batch, entries.hidden.data() + static_cast<int64_t>(start) * hidden,
                                     &chain_hidden, end == entries.tokens.size() ? 0 : -1);
    if (end == entries.tokens.size()) drafts.push_back(draft);
  }
  chain_hidden.erase(chain_hidden.begin(), chain_hidden.end() - hidden);  // the last entry's output
  for (int k = 1; k < K; ++k) {
    model::ForwardBatch batch;
    batch.add_sequence({drafts.back()}, context - 1 + k, table, options.block_size, false);
    std::vector<float> out_hidden;
    drafts.push_back(draft_step(batch, chain_hidden.data(), &out_hidden, k));
    chain_hidden = std::move(out_hidden);
  }
  return drafts;
}

}  // namespace

GenerateResult generate_speculative(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                                    const GenerateOptions& options) {
  const auto runner = model::make_cpu_runner(model);
  return generate_speculative(*runner, prompt, options);
}

GenerateResult generate_speculative(model::StepRunner& target, const std::vector<int32_t>& prompt,
                                    const GenerateOptions& options) {
  const io::ModelConfig& config = target.config();
  const int K = options.speculative_steps;
  if (K <= 0) fail("generate_speculative needs speculative_steps >= 1");
  if (!target.has_mtp()) fail("speculative decoding with MTP needs a checkpoint with an MTP layer");
  // Verification writes up to K + 1 positions past the last accepted token.
  const int64_t total = detail::checked_total_positions(config, prompt, options, K + 1);
  const std::vector<int32_t> table = detail::allocate_private(target, total, options);
  const int64_t hidden = config.hidden_size;
  const int vocab = config.vocab_size;

  GenerateResult result;
  result.speculative.accepted_per_position.assign(K, 0);
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  auto emit = [&](int32_t token) { return detail::append_token(config, options, token, result); };
  Sampler sampler(options.sampling.seed);
  std::vector<float> draft_probs(static_cast<size_t>(K) * vocab), target_probs(static_cast<size_t>(K + 1) * vocab);
  // One MTP step; draft k is drawn from its (last) row when k >= 0. Greedy runs take the argmax
  // from the runner (no logits come back); sampled runs keep draft k's distribution for the
  // rejection sampling.
  const bool greedy = options.sampling.temperature <= 0.0f;
  auto draft_step = [&](const model::ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out, int k) {
    if (greedy) return target.mtp_forward_selected(batch, h_prev, {model::RowOutput{}}, h_out).token[0];
    const std::vector<float> logits = target.mtp_forward(batch, h_prev, h_out);
    if (k < 0) return int32_t{-1};
    float* q = draft_probs.data() + static_cast<int64_t>(k) * vocab;
    Sampler::probabilities(logits.data(), vocab, options.sampling, q);
    return sampler.sample_from(q, vocab);
  };

  // Prefill, keeping every prompt position's pre-norm hidden state for the MTP entries.
  const auto prefill_start = std::chrono::steady_clock::now();
  MtpEntries entries;
  const std::vector<float> logits = detail::prefill(target, prompt, table, options, &entries.hidden);
  result.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();

  const auto decode_start = std::chrono::steady_clock::now();
  int32_t next = sampler.sample(logits.data(), vocab, options.sampling);
  if (emit(next)) return result;
  entries.tokens.assign(prompt.begin() + 1, prompt.end());
  entries.tokens.push_back(next);
  int context = static_cast<int>(prompt.size());  // target positions in the cache; `next` is at `context`

  while (true) {
    // 1. Draft K tokens: the pending entries (true hidden states), then the chain.
    const std::vector<int32_t> drafts = draft_tokens(draft_step, entries, hidden, context, K, table, options);

    // 2. Verify [next, d1 .. dK] in one target forward.
    std::vector<int32_t> verify = {next};
    verify.insert(verify.end(), drafts.begin(), drafts.end());
    model::ForwardBatch batch;
    batch.add_sequence(verify, context, table, options.block_size, true);
    model::ForwardTrace trace;
    trace.record_layers = false;  // only the last hidden states feed the MTP entries
    const DraftVerdict verdict =
        greedy ? verify_greedy(target, batch, drafts, &trace)
               : verify_sampled(target, batch, drafts, draft_probs, options, sampler, target_probs, &trace);
    ++result.decode_steps;
    ++result.speculative.steps;
    result.speculative.drafted += K;
    const int accepted = verdict.accepted;
    for (int k = 0; k < accepted; ++k) ++result.speculative.accepted_per_position[k];
    result.speculative.accepted += accepted;
    const int32_t bonus = verdict.next;

    bool finished = false;
    for (int i = 0; i < accepted && !finished; ++i) finished = emit(drafts[i]);
    if (!finished) finished = emit(bonus);
    if (finished) break;

    // 3. The verified positions become the next MTP entries, with the target's hidden states.
    entries.start = context;
    entries.tokens.assign(drafts.begin(), drafts.begin() + accepted);
    entries.tokens.push_back(bonus);
    entries.hidden.assign(trace.last_hidden.begin(), trace.last_hidden.begin() + (accepted + 1) * hidden);
    context += accepted + 1;
    next = bonus;
  }
  result.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count();
  return result;
}

}  // namespace glms::engine

#include "engine/drafter.h"

#include <algorithm>

#include "core/error.h"

namespace glms::engine {

namespace {

// One MTP forward of one rank: its batch, the hidden states it starts from, and which drafting
// sequences take a draft from which logits row.
struct DraftCall {
  model::ForwardBatch batch;
  std::vector<float> h_prev;             // [tokens, hidden]
  std::vector<ScheduledSequence*> takers;
  std::vector<int> last_entry;           // each taker's token index (its chain continues from there)
};

// Draws each taker's next draft from its row: the argmax, or a draw from the layer's
// distribution under the request's sampling parameters. Draws of different sequences run in
// parallel (each sequence has its own sampler).
void take_drafts(const std::vector<ScheduledSequence*>& takers, const model::StepLogits& logits, int vocab) {
#pragma omp parallel for schedule(dynamic) if (takers.size() > 1)
  for (int64_t row = 0; row < static_cast<int64_t>(takers.size()); ++row) {
    ScheduledSequence& s = *takers[row];
    if (!logits.row(row)) {
      s.draft_tokens.push_back(logits.token[row]);
      continue;
    }
    s.draft_probs.resize(s.draft_probs.size() + vocab);
    float* q = s.draft_probs.data() + s.draft_probs.size() - vocab;
    Sampler::probabilities(logits.row(row), vocab, s.seq->params.sampling, q);
    s.draft_tokens.push_back(s.seq->sampler.sample_from(q, vocab));
  }
}

// Runs calls[r][i] on every rank r for i = 0.. (ranks with fewer calls idle); after each,
// on_result(r, call, result) for the ranks that had one.
template <typename OnResult>
void run_in_lockstep(runtime::Executor& executor, std::vector<std::vector<DraftCall>>& calls, OnResult on_result) {
  size_t rounds = 0;
  for (const auto& rank_calls : calls) rounds = std::max(rounds, rank_calls.size());
  for (size_t i = 0; i < rounds; ++i) {
    std::vector<runtime::RankStep> steps(calls.size());
    for (size_t r = 0; r < calls.size(); ++r) {
      if (i >= calls[r].size()) continue;
      DraftCall& call = calls[r][i];
      steps[r].batch = call.batch;
      steps[r].h_prev = call.h_prev.data();
      for (const ScheduledSequence* s : call.takers) steps[r].outputs.push_back(verdict_output(s->seq->params));
    }
    std::vector<runtime::RankResult> results = executor.mtp_forward(steps);
    for (size_t r = 0; r < calls.size(); ++r)
      if (i < calls[r].size()) on_result(r, calls[r][i], results[r]);
  }
}

// The entries of one rank's speculating sequences, in forwards of at most max_batch_tokens; the
// last entry of a drafting sequence gives its first draft.
std::vector<DraftCall> entry_calls(std::vector<ScheduledSequence>& scheduled, const EngineConfig& config,
                                   int64_t hidden) {
  struct Piece {
    ScheduledSequence* s;
    int begin, end;  // positions whose entries run
  };
  std::vector<Piece> pieces;
  for (ScheduledSequence& s : scheduled) {
    Sequence& seq = *s.seq;
    if (!seq.speculates || seq.mtp_next >= seq.num_computed) {
      if (s.drafts > 0) {  // no entry to draft from (e.g. right after a prefix-cache hit)
        s.count -= s.drafts;
        s.drafts = 0;
      }
      continue;
    }
    GLMS_CHECK(static_cast<int64_t>(seq.mtp_hidden.size()) == (seq.num_computed - seq.mtp_next) * hidden,
               "MTP entries out of step with the computed tokens");
    for (int begin = seq.mtp_next; begin < seq.num_computed; begin += config.max_batch_tokens)
      pieces.push_back({&s, begin, std::min(seq.num_computed, begin + config.max_batch_tokens)});
  }
  std::vector<DraftCall> calls;
  for (size_t i = 0; i < pieces.size();) {
    DraftCall call;
    for (; i < pieces.size() && call.batch.num_tokens() + (pieces[i].end - pieces[i].begin) <= config.max_batch_tokens;
         ++i) {
      const Piece& p = pieces[i];
      Sequence& seq = *p.s->seq;
      call.batch.add_sequence(std::vector<int32_t>(seq.tokens.begin() + p.begin + 1, seq.tokens.begin() + p.end + 1),
                              p.begin, seq.block_table, config.block_size, false);
      if (p.end == seq.num_computed && p.s->drafts > 0) {
        call.takers.push_back(p.s);
        call.last_entry.push_back(call.batch.num_tokens() - 1);
      } else {
        call.batch.logits_tokens.pop_back();
      }
      const float* rows = seq.mtp_hidden.data() + int64_t{p.begin - seq.mtp_next} * hidden;
      call.h_prev.insert(call.h_prev.end(), rows, rows + int64_t{p.end - p.begin} * hidden);
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

void draft(runtime::Executor& executor, const EngineConfig& config, StepPlan& plan) {
  const int vocab = executor.config().vocab_size;
  const int64_t hidden = executor.config().hidden_size;
  const size_t num_ranks = plan.ranks.size();
  std::vector<std::vector<DraftCall>> calls(num_ranks);
  for (size_t r = 0; r < num_ranks; ++r) calls[r] = entry_calls(plan.ranks[r], config, hidden);

  // Per rank, the sequences drafting (in the order their first drafts come) and the layer's
  // output at each one's last entry [drafting, hidden], from which the chain continues.
  std::vector<std::vector<ScheduledSequence*>> drafting(num_ranks);
  std::vector<std::vector<float>> chain_hidden(num_ranks);
  run_in_lockstep(executor, calls, [&](size_t r, DraftCall& call, runtime::RankResult& result) {
    take_drafts(call.takers, result.logits, vocab);
    for (size_t d = 0; d < call.takers.size(); ++d) {
      drafting[r].push_back(call.takers[d]);
      const float* row = result.hidden.data() + int64_t{call.last_entry[d]} * hidden;
      chain_hidden[r].insert(chain_hidden[r].end(), row, row + hidden);
    }
  });
  for (auto& scheduled : plan.ranks)
    for (ScheduledSequence& s : scheduled)
      if (s.seq->speculates && s.seq->mtp_next < s.seq->num_computed) {
        s.seq->mtp_next = s.seq->num_computed;
        s.seq->mtp_hidden.clear();
      }

  // The chain: (the layer's output hidden, draft k) at the next position gives draft k + 1.
  for (int k = 1; k < config.speculative_steps; ++k) {
    std::vector<std::vector<DraftCall>> chain(num_ranks);
    std::vector<std::vector<size_t>> members(num_ranks);
    bool any = false;
    for (size_t r = 0; r < num_ranks; ++r) {
      DraftCall call;
      for (size_t i = 0; i < drafting[r].size(); ++i) {
        ScheduledSequence& s = *drafting[r][i];
        if (s.drafts <= k) continue;
        call.batch.add_sequence({s.draft_tokens.back()}, s.seq->num_computed - 1 + k, s.seq->block_table,
                                config.block_size, false);
        call.h_prev.insert(call.h_prev.end(), chain_hidden[r].begin() + i * hidden,
                           chain_hidden[r].begin() + (i + 1) * hidden);
        call.takers.push_back(&s);
        members[r].push_back(i);
      }
      if (call.takers.empty()) continue;
      chain[r].push_back(std::move(call));
      any = true;
    }
    if (!any) break;
    run_in_lockstep(executor, chain, [&](size_t r, DraftCall& call, runtime::RankResult& result) {
      take_drafts(call.takers, result.logits, vocab);
      for (size_t m = 0; m < members[r].size(); ++m)
        std::copy_n(result.hidden.data() + m * hidden, hidden, chain_hidden[r].data() + members[r][m] * hidden);
    });
  }
}

}  // namespace glms::engine

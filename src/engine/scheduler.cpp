// Scheduling and postprocessing of the engine's steps (scheduler.h). Per data-parallel rank, a
// step runs its decodes first (one token each, or 1 + K with speculation), then continues
// partial prefills, then admits waiting requests while that rank's token budget, sequence limit
// and free blocks allow. When a running sequence needs a block and none is free, the rank's
// cache evicts unused prefixes, then its most recently admitted sequence is preempted (blocks
// freed, tokens recomputed later). Only verified tokens count as computed, so neither cache ever
// holds a rejected draft as valid.
#include "engine/scheduler.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <span>

#include "core/error.h"
#include "ops/ops.h"

namespace glms::engine {

namespace {

constexpr float kNever = -std::numeric_limits<float>::infinity();

// vLLM's allowed_token_ids and bad_words: every token outside the allowed ones, and the last token
// of each bad word whose other tokens end the generated text, gets no chance. logits: [vocab];
// ids past it (a tokenizer larger than the model's rows) are no token of the model.
void mask_filtered_tokens(const RequestParams& p, std::span<const int32_t> generated, float* logits, int vocab) {
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  if (!p.allowed_token_ids.empty()) {
    std::vector<float> kept;
    kept.reserve(p.allowed_token_ids.size());
    for (const int32_t id : p.allowed_token_ids) kept.push_back(in_vocab(id) ? logits[id] : kNever);
    std::fill(logits, logits + vocab, kNever);
    for (size_t i = 0; i < kept.size(); ++i)
      if (in_vocab(p.allowed_token_ids[i])) logits[p.allowed_token_ids[i]] = kept[i];
  }
  for (const std::vector<int32_t>& word : p.bad_word_ids) {
    if (word.empty() || !in_vocab(word.back())) continue;
    const size_t before = word.size() - 1;
    if (before <= generated.size() && std::equal(word.begin(), word.end() - 1, generated.end() - before))
      logits[word.back()] = kNever;
  }
}

// The row that gives a sequence its next token: the argmax for greedy requests; for plainly
// sampled ones a token drawn where the logits are, with the sequence's next uniform value (so
// the seed decides the token wherever it is drawn); the same under the constraint's mask for a
// structured output that nothing else adjusts, where `device_masks` (the runner masks where the
// logits are); else the whole row, drawn here under the penalties, the mask or with logprobs.
model::RowOutput next_token_output(Sequence& seq, const io::ModelConfig& model, bool device_masks) {
  const RequestParams& p = seq.params;
  if (greedy_only(p) || plainly_sampled(p)) return seq.sampler.next_row_output(p.sampling);
  if (device_masks && only_masked(p)) {
    // As draw_token: the EOS ids keep their logits when the constraint may end (unless ignored).
    // Made on demand by the runner, while the step's forward runs on the device; the engine
    // touches the constraint again only after the step.
    model::RowOutput out = seq.sampler.next_row_output(p.sampling);
    out.mask_source_words = TokenConstraint::mask_words(model.vocab_size);
    out.mask_source = [constraint = p.constraint, vocab = model.vocab_size,
                       eos = p.ignore_eos ? std::vector<int32_t>{} : model.eos_token_ids](uint32_t* words) {
      constraint->next_token_bits(words, vocab, eos);
    };
    return out;
  }
  model::RowOutput out;
  out.kind = model::RowOutput::Kind::kLogits;
  return out;
}

// log-softmax of the raw logits at `token`, and the k best.
void fill_logprobs(const float* logits, int vocab, int top, GeneratedToken& out) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i] - max_logit));
  const float log_total = static_cast<float>(std::log(total)) + max_logit;
  out.logprob = logits[out.token] - log_total;
  if (top <= 0) return;
  std::vector<int32_t> best;
  glms::ops::top_k(logits, vocab, top, best);
  for (int32_t id : best) out.top_logprobs.push_back({id, logits[id] - log_total});
}

// Prompt logprobs: `token`'s logprob under `logits`, its rank, and the k likeliest.
GeneratedToken score_token(const float* logits, int vocab, int32_t token, int top) {
  GeneratedToken out;
  out.token = token;
  fill_logprobs(logits, vocab, top, out);
  out.rank = 1 + static_cast<int>(std::count_if(logits, logits + vocab, [&](float l) { return l > logits[token]; }));
  return out;
}

}  // namespace

// Logits rows the prompt-scoring chunk step[index] may take: the step's rows (engine_config.h)
// less those given out before it and those the sequences after it may need (1 + drafts each).
int Scheduler::prompt_rows_left(const std::vector<ScheduledSequence>& step, size_t index, size_t rows_so_far) const {
  int64_t later = 0;
  for (size_t k = index + 1; k < step.size(); ++k) later += step[k].seq->scores_prompt() ? 1 : step[k].drafts + 1;
  return static_cast<int>(std::max<int64_t>(0, max_logits_rows(config_) - later - static_cast<int64_t>(rows_so_far)));
}

// Rows [first_row, first_row + count) are the logits of the chunk's tokens at positions
// num_computed..; the row at position p scores prompt token p + 1.
void Scheduler::score_prompt(Sequence& seq, const model::StepLogits& logits, int64_t first_row, int count) {
  for (int j = 0; j < count; ++j) {
    const int position = seq.num_computed + j;
    if (position + 1 >= seq.prompt_len || position + 1 <= static_cast<int>(seq.prompt_logprobs.size())) continue;
    seq.prompt_logprobs.push_back(
        score_token(logits.row(first_row + j), model_.vocab_size, seq.tokens[position + 1], seq.params.prompt_logprobs));
  }
}

model::RowOutput verdict_output(const RequestParams& p) {
  model::RowOutput out;
  out.kind = greedy_only(p) ? model::RowOutput::Kind::kArgmax : model::RowOutput::Kind::kLogits;
  return out;
}

bool StepPlan::empty() const {
  return std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.empty(); });
}

Scheduler::Scheduler(const EngineConfig& config, const io::ModelConfig& model, int data_parallel, int blocks_per_rank)
    : config_(config), model_(model) {
  for (int r = 0; r < data_parallel; ++r)
    ranks_.push_back(std::make_unique<Rank>(blocks_per_rank, config.block_size, config.enable_prefix_cache));
  counters_.spec_accepted_per_position.assign(std::max(0, config.speculative_steps), 0);
}

Scheduler::~Scheduler() = default;

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

int Scheduler::num_running() const {
  int n = 0;
  for (const auto& rank : ranks_) n += static_cast<int>(rank->running.size());
  return n;
}

std::vector<uint64_t> Scheduler::request_ids() const {
  std::vector<uint64_t> ids;
  for (const auto& rank : ranks_)
    for (const auto& seq : rank->running) ids.push_back(seq->id);
  for (const auto& seq : waiting_) ids.push_back(seq->id);
  return ids;
}

void Scheduler::emit(const Sequence& seq, RequestOutput out) {
  if (out.finished) {
    // The request's phases, as vLLM's metrics split them.
    const Clock::time_point end = Clock::now();
    auto seconds = [](Clock::time_point from, Clock::time_point to) {
      return std::max(0.0, std::chrono::duration<double>(to - from).count());
    };
    if (seq.admitted_once) {
      out.queued_seconds = seconds(seq.arrival, seq.scheduled);
      out.inference_seconds = seconds(seq.scheduled, end);
      if (seq.num_generated() > 0) {
        out.prefill_seconds = seconds(seq.scheduled, seq.first_token);
        out.decode_seconds = seconds(seq.first_token, end);
      } else {
        out.prefill_seconds = out.inference_seconds;
      }
    } else {
      out.queued_seconds = seconds(seq.arrival, end);
    }
  }
  if (seq.on_output) outbox_.emplace_back(seq.on_output, std::move(out));
}

std::vector<std::pair<OutputCallback, RequestOutput>> Scheduler::take_outbox() {
  std::vector<std::pair<OutputCallback, RequestOutput>> ready;
  ready.swap(outbox_);
  return ready;
}

void Scheduler::finish(Sequence& seq, const std::string& reason, const std::string& error) {
  if (seq.rank >= 0) ranks_[seq.rank]->blocks.release(seq);
  emit_end(seq, reason, error);
}

void Scheduler::emit_end(Sequence& seq, const std::string& reason, const std::string& error, bool request_error) {
  RequestOutput out;
  out.request_id = seq.id;
  out.finished = true;
  out.finish_reason = reason;
  out.error = error;
  out.request_error = request_error;
  out.prompt_tokens = seq.prompt_len;
  out.cached_prompt_tokens = seq.cached_prompt_tokens;
  out.completion_tokens = seq.num_generated();
  emit(seq, std::move(out));
}

void Scheduler::finish_running(const std::string& reason, const std::string& error) {
  for (auto& rank : ranks_) {
    for (auto& seq : rank->running) finish(*seq, reason, error);
    rank->running.clear();
  }
}

void Scheduler::finish_all(const std::string& reason) {
  finish_running(reason, "");
  for (auto& seq : waiting_) finish(*seq, reason);
  waiting_.clear();
}

void Scheduler::end_with_error(const std::vector<uint64_t>& ids, const std::string& error) {
  auto end_in = [&](auto& queue) {
    for (auto it = queue.begin(); it != queue.end();) {
      if (std::find(ids.begin(), ids.end(), (*it)->id) == ids.end()) {
        ++it;
        continue;
      }
      finish(**it, "error", error);
      it = queue.erase(it);
    }
  };
  for (auto& rank : ranks_) end_in(rank->running);
  end_in(waiting_);
}

void Scheduler::end_requests(const std::vector<uint64_t>& cancelled, Clock::time_point now) {
  auto reason_to_end = [&](const Sequence& seq) -> std::string {
    if (std::find(cancelled.begin(), cancelled.end(), seq.id) != cancelled.end()) return "abort";
    if (seq.params.timeout_seconds > 0 &&
        std::chrono::duration<double>(now - seq.arrival).count() > seq.params.timeout_seconds)
      return "timeout";
    return "";
  };
  auto end_in = [&](auto& queue) {
    for (auto it = queue.begin(); it != queue.end();) {
      const std::string reason = reason_to_end(**it);
      if (reason.empty()) {
        ++it;
        continue;
      }
      finish(**it, reason);
      it = queue.erase(it);
    }
  };
  for (auto& rank : ranks_) end_in(rank->running);
  end_in(waiting_);
}

bool Scheduler::preempt_one(Rank& rank, const Sequence* keep) {
  for (auto it = rank.running.rbegin(); it != rank.running.rend(); ++it) {
    if (it->get() == keep) continue;
    std::unique_ptr<Sequence> victim = std::move(*it);
    rank.running.erase(std::next(it).base());
    rank.blocks.release(*victim);  // recomputed from its tokens (prompt + generated) when readmitted
    victim->rank = -1;
    waiting_.push_front(std::move(victim));
    ++counters_.num_preemptions;
    return true;
  }
  return false;
}

int Scheduler::draft_budget(const Sequence& seq) const {
  if (!seq.speculates) return 0;
  // Every kept draft and the token after them must fit max_tokens and max_model_len.
  const int tokens_left = seq.params.max_tokens - seq.num_generated();
  const int positions_left = config_.max_model_len - static_cast<int>(seq.tokens.size());
  return std::max(0, std::min({config_.speculative_steps, tokens_left - 1, positions_left - 1}));
}

// Rank r's running sequences: decodes (pass 0), then unfinished prefills (pass 1). A
// speculative decode takes 1 + its drafts from the budget and in blocks.
void Scheduler::schedule_running(int r, std::vector<ScheduledSequence>& scheduled, int& budget, bool speculate) {
  Rank& rank = *ranks_[r];
  for (int pass = 0; pass < 2; ++pass) {
    for (auto it = rank.running.begin(); it != rank.running.end() && budget > 0;) {
      Sequence& seq = **it;
      const bool is_decode = seq.pending() == 1;
      if ((pass == 0) != is_decode) {
        ++it;
        continue;
      }
      const int drafts = is_decode && speculate ? std::min(draft_budget(seq), budget - 1) : 0;
      const int count = is_decode ? 1 + drafts : std::min(seq.pending(), budget);
      bool ok = rank.blocks.ensure(seq, seq.num_computed + count);
      while (!ok && preempt_one(rank, &seq)) ok = rank.blocks.ensure(seq, seq.num_computed + count);
      if (!ok) {  // nothing left to preempt: this one waits for memory itself
        std::unique_ptr<Sequence> self = std::move(*it);
        it = rank.running.erase(it);
        rank.blocks.release(*self);
        self->rank = -1;
        waiting_.push_front(std::move(self));
        ++counters_.num_preemptions;
        continue;
      }
      scheduled.emplace_back(&seq, count, drafts);
      budget -= count;
      ++it;
    }
  }
  // A preemption above may have removed a sequence already scheduled: keep only live ones.
  std::erase_if(scheduled, [&](const ScheduledSequence& s) {
    return std::none_of(rank.running.begin(), rank.running.end(), [&](const auto& q) { return q.get() == s.seq; });
  });
}

std::vector<int> Scheduler::rank_preference(const Sequence& seq, const std::vector<int>& budgets) const {
  struct Candidate {
    int rank, cached, running, scheduled_tokens;
  };
  std::vector<Candidate> candidates;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    const Rank& rank = *ranks_[r];
    if (budgets[r] <= 0 || static_cast<int>(rank.running.size()) >= config_.max_num_seqs) continue;
    const int cached = ranks_.size() > 1 ? rank.blocks.cached_tokens(seq.tokens, seq.params.cache_salt) : 0;
    candidates.push_back({r, cached, static_cast<int>(rank.running.size()), config_.max_batch_tokens - budgets[r]});
  }
  // Most cached prompt first (a prefix hit saves its prefill), then the least loaded.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.cached != b.cached) return a.cached > b.cached;
    if (a.running != b.running) return a.running < b.running;
    return a.scheduled_tokens < b.scheduled_tokens;
  });
  std::vector<int> order;
  for (const Candidate& c : candidates) order.push_back(c.rank);
  return order;
}

void Scheduler::admit(StepPlan& plan, std::vector<int>& budgets) {
  while (!waiting_.empty()) {
    Sequence& seq = *waiting_.front();
    const std::vector<int> order = rank_preference(seq, budgets);
    if (order.empty()) return;  // every rank is full this step
    int admitted_on = -1;
    bool fits_nowhere = true;  // no rank, even idle, could hold it
    for (int r : order) {
      Rank& rank = *ranks_[r];
      if (seq.params.prompt_logprobs < 0) rank.blocks.take_cached_prefix(seq);
      const int count = std::min(seq.pending(), budgets[r]);
      if (rank.blocks.ensure(seq, seq.num_computed + count)) {
        admitted_on = r;
        break;
      }
      if (!rank.running.empty() || !plan.ranks[r].empty()) fits_nowhere = false;
      rank.blocks.release(seq);  // hold nothing while waiting for running requests to free blocks
    }
    if (admitted_on < 0) {
      if (!fits_nowhere) return;
      std::unique_ptr<Sequence> self = std::move(waiting_.front());
      waiting_.pop_front();
      finish(*self, "error", "the KV cache is too small for this request");
      continue;
    }
    Rank& rank = *ranks_[admitted_on];
    if (!seq.admitted_once) {
      seq.cached_prompt_tokens = seq.num_computed;
      counters_.prompt_tokens_total += seq.prompt_len;
      rank.blocks.record_lookup(seq.prompt_len, seq.cached_prompt_tokens);
    }
    if (!seq.admitted_once) seq.scheduled = Clock::now();
    seq.admitted_once = true;
    seq.rank = admitted_on;
    const int count = std::min(seq.pending(), budgets[admitted_on]);
    rank.running.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    plan.ranks[admitted_on].emplace_back(rank.running.back().get(), count);
    budgets[admitted_on] -= count;
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.ranks.resize(ranks_.size());
  std::vector<int> budgets(ranks_.size(), config_.max_batch_tokens);
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    const auto& running = ranks_[r]->running;
    const auto decodes = std::count_if(running.begin(), running.end(), [](const auto& q) { return q->pending() == 1; });
    const bool speculate = config_.speculative_max_batch <= 0 || decodes <= config_.speculative_max_batch;
    schedule_running(r, plan.ranks[r], budgets[r], speculate);
  }
  admit(plan, budgets);
  return plan;
}

std::vector<runtime::RankStep> Scheduler::make_steps(StepPlan& plan) const {
  std::vector<runtime::RankStep> steps(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    model::ForwardBatch& batch = steps[r].batch;
    std::vector<model::RowOutput>& outputs = steps[r].outputs;
    // Speculative decodes verify [pending token, drafts] with logits for each; other sequences
    // need logits only when their tokens are all computed.
    for (ScheduledSequence& s : plan.ranks[r]) {
      Sequence& seq = *s.seq;
      if (s.drafts > 0) {
        std::vector<int32_t> verify = {seq.tokens.back()};
        verify.insert(verify.end(), s.draft_tokens.begin(), s.draft_tokens.end());
        batch.add_sequence(verify, seq.num_computed, seq.block_table, config_.block_size, true);
        s.first_row = static_cast<int64_t>(outputs.size());
        outputs.insert(outputs.end(), s.drafts + 1, verdict_output(seq.params));
        continue;
      }
      if (seq.scores_prompt()) {
        // Every token of the chunk gets a row (kept within the step's logits rows).
        const size_t index = static_cast<size_t>(&s - plan.ranks[r].data());
        s.count = std::min(s.count, prompt_rows_left(plan.ranks[r], index, outputs.size()));
        if (s.count == 0) continue;  // no rows left this step: the chunk waits
        const bool completes = seq.num_computed + s.count == static_cast<int>(seq.tokens.size());
        batch.add_sequence(std::vector<int32_t>(seq.tokens.begin() + seq.num_computed,
                                                seq.tokens.begin() + seq.num_computed + s.count),
                           seq.num_computed, seq.block_table, config_.block_size, true);
        s.prompt_rows = static_cast<int64_t>(outputs.size());
        model::RowOutput whole;
        whole.kind = model::RowOutput::Kind::kLogits;
        outputs.insert(outputs.end(), s.count, whole);
        s.first_row = completes ? s.prompt_rows + s.count - 1 : -1;
        continue;
      }
      const bool completes = seq.num_computed + s.count == static_cast<int>(seq.tokens.size());
      batch.add_sequence(std::vector<int32_t>(seq.tokens.begin() + seq.num_computed,
                                              seq.tokens.begin() + seq.num_computed + s.count),
                         seq.num_computed, seq.block_table, config_.block_size, false);
      if (!completes) {
        batch.logits_tokens.pop_back();
        s.first_row = -1;
        continue;
      }
      s.first_row = static_cast<int64_t>(outputs.size());
      outputs.push_back(next_token_output(seq, model_, config_.device_token_masks));
    }
  }
  return steps;
}

int32_t Scheduler::draw_token(Sequence& seq, const float* raw_logits) {
  const RequestParams& p = seq.params;
  const float* logits = raw_logits;
  std::vector<float> adjusted;
  if (adjusts_logits(p)) {
    adjusted.assign(raw_logits, raw_logits + model_.vocab_size);
    if (p.repetition_penalty != 1.0f) {
      std::vector<bool> seen(model_.vocab_size, false);
      for (int32_t t : seq.tokens) seen[t] = true;
      for (int i = 0; i < model_.vocab_size; ++i)
        if (seen[i]) adjusted[i] = adjusted[i] > 0 ? adjusted[i] / p.repetition_penalty : adjusted[i] * p.repetition_penalty;
    }
    for (const auto& [token, count] : seq.generated_counts)
      adjusted[token] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    for (const auto& [token, bias] : p.logit_bias)
      if (token >= 0 && token < model_.vocab_size) adjusted[token] += bias;
    mask_filtered_tokens(p, std::span<const int32_t>(seq.tokens).subspan(seq.prompt_len), adjusted.data(),
                         model_.vocab_size);
    if (p.constraint) {
      std::vector<float> eos;
      for (int32_t id : model_.eos_token_ids) eos.push_back(adjusted[id]);
      p.constraint->mask(adjusted.data(), model_.vocab_size);
      if (p.constraint->may_end() && !p.ignore_eos)
        for (size_t i = 0; i < eos.size(); ++i) adjusted[model_.eos_token_ids[i]] = eos[i];
    }
    if (seq.num_generated() < p.min_tokens) {
      if (!p.ignore_eos)
        for (int32_t id : model_.eos_token_ids) adjusted[id] = kNever;
      for (int32_t id : p.stop_token_ids)
        if (id >= 0 && id < model_.vocab_size) adjusted[id] = kNever;
    }
    if (std::none_of(adjusted.begin(), adjusted.end(), [](float v) { return v > kNever; })) return kNoTokenLeft;
    logits = adjusted.data();
  }
  return seq.sampler.sample(logits, model_.vocab_size, p.sampling);
}

bool Scheduler::report_token(Sequence& seq, int32_t token_id, const float* raw_logits) {
  const RequestParams& p = seq.params;
  if (p.constraint) {
    const std::string failure = p.constraint->failure();
    if (!failure.empty()) {  // the token was drawn under a mask the constraint could not make
      emit_end(seq, "error", failure, true);
      return true;  // the caller releases its blocks
    }
  }
  GeneratedToken generated;
  generated.token = token_id;
  if (p.top_logprobs >= 0) fill_logprobs(raw_logits, model_.vocab_size, p.top_logprobs, generated);
  seq.tokens.push_back(generated.token);
  if (seq.num_generated() == 1) seq.first_token = Clock::now();
  if (p.constraint) p.constraint->accept(generated.token);
  ++seq.generated_counts[generated.token];
  ++counters_.generation_tokens_total;

  RequestOutput out;
  out.request_id = seq.id;
  out.prompt_tokens = seq.prompt_len;
  out.cached_prompt_tokens = seq.cached_prompt_tokens;
  out.completion_tokens = seq.num_generated();
  out.new_tokens.push_back(std::move(generated));
  if (p.prompt_logprobs >= 0 && !seq.prompt_logprobs_sent) {
    out.prompt_logprobs = seq.prompt_logprobs;
    seq.prompt_logprobs_sent = true;
  }
  const int32_t token = out.new_tokens.back().token;
  const auto& eos_ids = model_.eos_token_ids;
  const bool eos = !p.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (eos || stop_id) out.finish_reason = "stop";
  else if (seq.num_generated() >= p.max_tokens || static_cast<int>(seq.tokens.size()) >= config_.max_model_len)
    out.finish_reason = "length";
  out.finished = !out.finish_reason.empty();
  const bool finished = out.finished;
  emit(seq, std::move(out));
  return finished;
}

void Scheduler::postprocess(StepPlan& plan, std::vector<runtime::RankResult>& results, const std::string& error) {
  ++counters_.steps;
  int64_t step_tokens = 0;
  for (const std::vector<ScheduledSequence>& rank : plan.ranks)
    for (const ScheduledSequence& s : rank) step_tokens += s.count;
  if (counters_.iteration_tokens.empty()) counters_.iteration_tokens.assign(kIterationTokenBuckets.size() + 1, 0);
  size_t bucket = 0;
  while (bucket < kIterationTokenBuckets.size() && double(step_tokens) > kIterationTokenBuckets[bucket]) ++bucket;
  ++counters_.iteration_tokens[bucket];
  counters_.iteration_tokens_sum += step_tokens;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    if (plan.ranks[r].empty()) continue;
    if (!error.empty()) {
      Rank& rank = *ranks_[r];
      for (ScheduledSequence& s : plan.ranks[r]) {
        finish(*s.seq, "error", error);
        rank.running.remove_if([&](const auto& q) { return q.get() == s.seq; });
      }
      continue;
    }
    advance(static_cast<int>(r), plan.ranks[r], results[r]);
  }
}

// Advances, samples or verifies and reports rank r's sequences; finished ones leave. Rows that
// came back whole (penalties, logprobs) draw their tokens first, in parallel: each sequence has
// its own sampler, and a draw over GLM's vocabulary takes about a millisecond.
void Scheduler::advance(int r, std::vector<ScheduledSequence>& scheduled, runtime::RankResult& result) {
  const model::StepLogits& logits = result.logits;
  const int64_t hidden = model_.hidden_size;
  std::vector<int32_t> drawn(scheduled.size(), -1);
  std::vector<size_t> draws;  // sequences whose next token is drawn here
  for (size_t i = 0; i < scheduled.size(); ++i)
    if (scheduled[i].drafts == 0 && scheduled[i].first_row >= 0 && logits.row(scheduled[i].first_row)) draws.push_back(i);
#pragma omp parallel for schedule(dynamic) if (draws.size() > 1)
  for (int64_t d = 0; d < static_cast<int64_t>(draws.size()); ++d)
    drawn[draws[d]] = draw_token(*scheduled[draws[d]].seq, logits.row(scheduled[draws[d]].first_row));

  std::vector<Sequence*> done;
  int first_token = 0;  // each sequence's tokens follow the previous ones' in the batch
  for (size_t i = 0; i < scheduled.size(); ++i) {
    ScheduledSequence& s = scheduled[i];
    Sequence& seq = *s.seq;
    const float* seq_hidden = config_.speculative_steps > 0 ? result.hidden.data() + int64_t{first_token} * hidden : nullptr;
    first_token += s.count;
    if (s.drafts > 0) {
      verify(s, logits, seq_hidden, done);
      continue;
    }
    if (seq.speculates) seq.mtp_hidden.insert(seq.mtp_hidden.end(), seq_hidden, seq_hidden + s.count * hidden);
    if (s.prompt_rows >= 0) score_prompt(seq, logits, s.prompt_rows, s.count);
    seq.num_computed += s.count;
    ranks_[r]->blocks.cache_full_blocks(seq);
    if (s.first_row >= 0 && drawn[i] == kNoTokenLeft) {
      emit_end(seq, "error",
               "no token may come next: allowed_token_ids, bad_words, min_tokens and the structured output together "
               "hold back every token",
               true);
      done.push_back(&seq);
    } else if (s.first_row >= 0) {
      const int32_t token = drawn[i] >= 0 ? drawn[i] : logits.token[s.first_row];
      if (report_token(seq, token, logits.row(s.first_row))) done.push_back(&seq);
    }
  }
  Rank& rank = *ranks_[r];
  for (Sequence* seq : done) {
    rank.blocks.release(*seq);
    rank.running.remove_if([seq](const auto& q) { return q.get() == seq; });
  }
}

// A speculative decode's verdict: logits rows [drafts + 1] and the target's hidden states
// [drafts + 1, hidden] of [pending token, drafts]. Kept drafts and the token after them are
// reported one at a time, so a stop lands exactly where plain decoding would stop.
void Scheduler::verify(ScheduledSequence& s, const model::StepLogits& logits, const float* hidden_rows,
                       std::vector<Sequence*>& done) {
  Sequence& seq = *s.seq;
  const int vocab = model_.vocab_size;
  const int64_t hidden = model_.hidden_size;
  const int64_t first_row = s.first_row;
  DraftVerdict verdict;
  if (!logits.row(first_row)) {
    // Greedy: drafts stand while they equal the target's argmax; the next token is the argmax
    // after the last one standing (verify_drafts on one-hot distributions, without them).
    while (verdict.accepted < s.drafts && s.draft_tokens[verdict.accepted] == logits.token[first_row + verdict.accepted])
      ++verdict.accepted;
    verdict.next = logits.token[first_row + verdict.accepted];
  } else {
    std::vector<float> target_probs(static_cast<size_t>(s.drafts + 1) * vocab);
    for (int k = 0; k <= s.drafts; ++k)
      Sampler::probabilities(logits.row(first_row + k), vocab, seq.params.sampling, target_probs.data() + int64_t{k} * vocab);
    verdict = seq.sampler.verify_drafts(s.draft_tokens.data(), s.drafts, s.draft_probs.data(), target_probs.data(), vocab);
  }
  ++counters_.spec_drafts;
  counters_.spec_draft_tokens += s.drafts;
  counters_.spec_accepted_tokens += verdict.accepted;
  for (int k = 0; k < verdict.accepted; ++k) ++counters_.spec_accepted_per_position[k];

  for (int k = 0; k <= verdict.accepted; ++k) {
    const int32_t token = k < verdict.accepted ? s.draft_tokens[k] : verdict.next;
    if (report_token(seq, token, logits.row(first_row + k))) {
      done.push_back(&seq);
      return;
    }
  }
  // Verified rows: the pending token and the kept drafts; their hidden states are the next
  // MTP entries (mtp_next is at the pending token's position since drafting).
  seq.mtp_hidden.assign(hidden_rows, hidden_rows + (verdict.accepted + 1) * hidden);
  seq.num_computed += 1 + verdict.accepted;
  ranks_[seq.rank]->blocks.cache_full_blocks(seq);
}

int Scheduler::drop_cached_prefixes() {
  int freed = 0;
  for (const std::unique_ptr<Rank>& rank : ranks_) freed += rank->blocks.drop_cached_prefixes();
  return freed;
}

EngineStats Scheduler::stats() const {
  EngineStats s = counters_;
  s.num_waiting = static_cast<int>(waiting_.size());
  for (const auto& rank : ranks_) {
    RankStats r;
    r.num_running = static_cast<int>(rank->running.size());
    r.num_blocks = rank->blocks.num_blocks();
    r.num_free_blocks = rank->blocks.num_free();
    r.num_cached_blocks = rank->blocks.num_cached();
    r.kv_cache_usage = r.num_blocks > 0 ? 1.0 - static_cast<double>(r.num_free_blocks) / r.num_blocks : 0.0;
    r.prefix_cache_queries = rank->blocks.query_tokens();
    r.prefix_cache_hits = rank->blocks.hit_tokens();
    s.add(r);
    s.ranks.push_back(r);
  }
  return s;
}

}  // namespace glms::engine

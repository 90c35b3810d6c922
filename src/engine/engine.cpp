// The engine loop. Each step: finish cancelled and timed-out requests; schedule running
// decodes first (one token each), then continue partial prefills, then admit waiting requests
// (prefix-cache hits skip their cached blocks) while the token budget, the sequence limit and
// free blocks allow; run one forward over the mixed batch; sample for every sequence whose
// tokens are all computed; report. When a running sequence needs a block and none is free,
// the cache evicts unused prefixes, then the most recently admitted sequence is preempted
// (its blocks freed, its tokens recomputed later).
//
// With speculative_steps K > 0 (and at most speculative_max_batch decoding sequences in the
// step; above it decodes go plainly), a decode reserves 1 + K slots: before the forward, the MTP
// layer runs over each sequence's pending entries (target hidden states of positions computed
// since its last run) and chains K drafts; the forward verifies [pending token, drafts] beside
// the other sequences' decodes and prefill chunks; Sampler::verify_drafts keeps drafts, which
// are reported one token at a time (so EOS, stop ids and max_tokens cut exactly where plain
// decoding would). Only verified tokens count as computed, so neither the cache nor the prefix
// cache ever holds a rejected draft as valid. The MTP cache shares the block ids; its rows
// only steer the drafts (a prefix-cache hit reuses the writer's rows), never the output.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/sequence.h"
#include "kv/prefix_cache.h"

namespace glms::engine {

struct Engine::Impl {
  Impl(std::unique_ptr<model::StepRunner> runner, EngineConfig config);
  ~Impl();
  void loop();
  void step(std::unique_lock<std::mutex>& lock);
  struct Scheduled {
    Scheduled(Sequence* s, int tokens, int num_drafts = 0) : seq(s), count(tokens), drafts(num_drafts) {}
    Sequence* seq;
    int count;                       // tokens this step (1 + drafts for a speculative decode)
    int drafts;                      // draft tokens to verify
    std::vector<int32_t> draft_tokens;
    std::vector<float> draft_probs;  // [drafts, vocab] the distributions they were drawn from
  };
  void finish(Sequence& seq, const std::string& reason, const std::string& error = "");
  void release_blocks(Sequence& seq);
  bool ensure_blocks(Sequence& seq, int num_tokens);
  bool preempt_one(const Sequence* keep);
  // The next token from a row's logits under the request's penalties and sampling parameters.
  int32_t draw_token(Sequence& seq, const float* raw_logits);
  bool report_token(Sequence& seq, int32_t token, const float* raw_logits);
  int draft_budget(const Sequence& seq) const;
  void draft(std::unique_lock<std::mutex>& lock, std::vector<Scheduled>& scheduled);
  // Verifies s's drafts against logits rows first_row .. first_row + s.drafts.
  void verify(Scheduled& s, const model::StepLogits& logits, int64_t first_row, const float* hidden,
              std::vector<Sequence*>& done);
  void cache_full_blocks(Sequence& seq);
  void emit(const Sequence& seq, RequestOutput out);
  void deliver(std::unique_lock<std::mutex>& lock);

  std::unique_ptr<model::StepRunner> runner;  // the model and its paged cache
  EngineConfig config;
  kv::BlockPool pool;
  kv::PrefixCache prefix_cache;

  mutable std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::deque<std::unique_ptr<Sequence>> waiting;  // FIFO; preempted sequences go to the front
  std::list<std::unique_ptr<Sequence>> running;   // in admission order
  std::vector<uint64_t> cancelled;
  uint64_t next_id = 1;
  bool stopping = false;
  bool draining = false;
  EngineStats counters;
  // Outputs produced under the lock, delivered after it is released so that a callback may
  // call back into the engine (cancel on a stop string, submit the next request).
  std::vector<std::pair<OutputCallback, RequestOutput>> outbox;
  std::thread thread;
};

namespace {

// A row whose logits decide drafts or a verdict: the argmax for greedy requests, else the whole
// row (drafts keep their distribution; verification compares distributions).
model::RowOutput verdict_output(const RequestParams& p) {
  model::RowOutput out;
  out.kind = greedy_only(p) ? model::RowOutput::Kind::kArgmax : model::RowOutput::Kind::kLogits;
  return out;
}

// The row that gives a sequence its next token: the argmax for greedy requests; for plainly
// sampled ones a token drawn where the logits are, with the sequence's next uniform value (so
// the seed decides the token wherever it is drawn); else the whole row, drawn here under the
// penalties or with logprobs.
model::RowOutput next_token_output(Sequence& seq) {
  const RequestParams& p = seq.params;
  if (greedy_only(p) || plainly_sampled(p)) return seq.sampler.next_row_output(p.sampling);
  model::RowOutput out;
  out.kind = model::RowOutput::Kind::kLogits;
  return out;
}

int default_num_blocks(const model::StepRunner& runner, const EngineConfig& config) {
  const int64_t bytes_per_token = runner.cache_bytes_per_token();
  const int64_t bytes_per_block = bytes_per_token * config.block_size;
  int64_t bytes = config.kv_cache_bytes;
  if (bytes <= 0) {
    const int64_t wanted = int64_t{config.max_num_seqs} * config.max_model_len * bytes_per_token;
    bytes = std::min<int64_t>(wanted, int64_t{2} << 30);
  }
  const int64_t blocks = bytes / bytes_per_block;
  if (blocks < (config.max_model_len + config.block_size - 1) / config.block_size)
    fail("the KV cache (" + std::to_string(bytes) + " bytes, " + std::to_string(blocks) +
         " blocks) cannot hold one sequence of max_model_len " + std::to_string(config.max_model_len) +
         " tokens: raise --kv-cache-memory or lower --max-model-len");
  return static_cast<int>(std::min<int64_t>(blocks, 1 << 24));
}

EngineConfig resolve(const io::ModelConfig& model, EngineConfig config) {
  if (config.max_model_len <= 0) config.max_model_len = model.max_position_embeddings;
  if (config.max_num_seqs <= 0) fail("max_num_seqs must be positive");
  if (config.max_batch_tokens <= 0) fail("max_batch_tokens must be positive");
  if (config.block_size <= 0) fail("block_size must be positive");
  return config;
}

// Runs `work` with the lock released and takes it back however `work` ends (the loop's error
// handling expects the lock held).
template <typename Work>
auto unlocked(std::unique_lock<std::mutex>& lock, Work&& work) {
  struct Relock {
    std::unique_lock<std::mutex>& lock;
    ~Relock() { lock.lock(); }
  };
  lock.unlock();
  Relock relock{lock};
  return work();
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

}  // namespace

Engine::Impl::Impl(std::unique_ptr<model::StepRunner> r, EngineConfig c)
    : runner(std::move(r)),
      config(resolve(runner->config(), c)),
      pool(default_num_blocks(*runner, config)),
      prefix_cache(pool, config.block_size) {
  model::CacheShape shape;
  shape.block_size = config.block_size;
  shape.num_blocks = pool.num_blocks();
  shape.max_tokens = config.max_batch_tokens;
  shape.max_sequences = config.max_num_seqs;
  shape.max_context = config.max_model_len;
  shape.mtp = config.speculative_steps > 0;
  // Verifying K drafts asks for K + 1 logits rows per sequence.
  shape.max_logits = std::min(config.max_batch_tokens, config.max_num_seqs * (1 + std::max(0, config.speculative_steps)));
  if (shape.mtp && !runner->has_mtp())
    fail("speculative decoding needs a checkpoint with an MTP layer (this " + runner->device() + " runner has none)");
  runner->allocate(shape);
  counters.num_blocks = pool.num_blocks();
  counters.spec_accepted_per_position.assign(std::max(0, config.speculative_steps), 0);
  thread = std::thread([this] { loop(); });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  thread.join();
}

void Engine::Impl::release_blocks(Sequence& seq) {
  for (int32_t block : seq.block_table) pool.release(block);
  seq.block_table.clear();
  seq.num_computed = 0;
  seq.cached_blocks = 0;
  seq.mtp_next = 0;
  seq.mtp_hidden.clear();
}

void Engine::Impl::finish(Sequence& seq, const std::string& reason, const std::string& error) {
  release_blocks(seq);
  RequestOutput out;
  out.request_id = seq.id;
  out.finished = true;
  out.finish_reason = reason;
  out.error = error;
  out.prompt_tokens = seq.prompt_len;
  out.cached_prompt_tokens = seq.cached_prompt_tokens;
  out.completion_tokens = seq.num_generated();
  emit(seq, std::move(out));
}

void Engine::Impl::emit(const Sequence& seq, RequestOutput out) {
  if (seq.on_output) outbox.emplace_back(seq.on_output, std::move(out));
}

void Engine::Impl::deliver(std::unique_lock<std::mutex>& lock) {
  if (outbox.empty()) return;
  std::vector<std::pair<OutputCallback, RequestOutput>> ready;
  ready.swap(outbox);
  lock.unlock();
  for (auto& [callback, output] : ready) {
    try {
      callback(output);
    } catch (...) {
      // A consumer's failure is its own: the engine and the other requests carry on.
    }
  }
  lock.lock();
}

bool Engine::Impl::ensure_blocks(Sequence& seq, int num_tokens) {
  const int needed = (num_tokens + config.block_size - 1) / config.block_size;
  while (static_cast<int>(seq.block_table.size()) < needed) {
    std::optional<int> block = pool.allocate();
    if (!block && prefix_cache.evict(needed - static_cast<int>(seq.block_table.size())) > 0) block = pool.allocate();
    if (!block) return false;
    seq.block_table.push_back(*block);
  }
  return true;
}

bool Engine::Impl::preempt_one(const Sequence* keep) {
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (it->get() == keep) continue;
    std::unique_ptr<Sequence> victim = std::move(*it);
    running.erase(std::next(it).base());
    release_blocks(*victim);  // recomputed from its tokens (prompt + generated) when readmitted
    waiting.push_front(std::move(victim));
    ++counters.num_preemptions;
    return true;
  }
  return false;
}

void Engine::Impl::cache_full_blocks(Sequence& seq) {
  if (!config.enable_prefix_cache) return;
  const int full = seq.num_computed / config.block_size;
  if (full <= seq.cached_blocks) return;  // no block filled since the last insert
  seq.cached_blocks = full;
  prefix_cache.insert(std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(full) * config.block_size),
                      std::span<const int32_t>(seq.block_table.data(), full));
}

int32_t Engine::Impl::draw_token(Sequence& seq, const float* raw_logits) {
  const io::ModelConfig& mc = runner->config();
  const RequestParams& p = seq.params;
  const float* logits = raw_logits;
  std::vector<float> adjusted;
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f) {
    adjusted.assign(raw_logits, raw_logits + mc.vocab_size);
    if (p.repetition_penalty != 1.0f) {
      std::vector<bool> seen(mc.vocab_size, false);
      for (int32_t t : seq.tokens) seen[t] = true;
      for (int i = 0; i < mc.vocab_size; ++i)
        if (seen[i]) adjusted[i] = adjusted[i] > 0 ? adjusted[i] / p.repetition_penalty : adjusted[i] * p.repetition_penalty;
    }
    for (const auto& [token, count] : seq.generated_counts)
      adjusted[token] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    logits = adjusted.data();
  }
  return seq.sampler.sample(logits, mc.vocab_size, p.sampling);
}

bool Engine::Impl::report_token(Sequence& seq, int32_t token_id, const float* raw_logits) {
  const io::ModelConfig& mc = runner->config();
  const RequestParams& p = seq.params;
  GeneratedToken generated;
  generated.token = token_id;
  if (p.top_logprobs >= 0) fill_logprobs(raw_logits, mc.vocab_size, p.top_logprobs, generated);
  seq.tokens.push_back(generated.token);
  ++seq.generated_counts[generated.token];
  ++counters.generation_tokens_total;

  RequestOutput out;
  out.request_id = seq.id;
  out.prompt_tokens = seq.prompt_len;
  out.cached_prompt_tokens = seq.cached_prompt_tokens;
  out.completion_tokens = seq.num_generated();
  out.new_tokens.push_back(std::move(generated));
  const int32_t token = out.new_tokens.back().token;
  const bool eos = !p.ignore_eos && std::find(mc.eos_token_ids.begin(), mc.eos_token_ids.end(), token) !=
                                        mc.eos_token_ids.end();
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (eos || stop_id) out.finish_reason = "stop";
  else if (seq.num_generated() >= p.max_tokens || static_cast<int>(seq.tokens.size()) >= config.max_model_len)
    out.finish_reason = "length";
  out.finished = !out.finish_reason.empty();
  const bool finished = out.finished;
  emit(seq, std::move(out));
  return finished;
}

void Engine::Impl::loop() {
  std::unique_lock lock(mutex);
  while (true) {
    wake.wait(lock, [this] { return stopping || !waiting.empty() || !running.empty() || !cancelled.empty(); });
    if (stopping) break;
    try {
      step(lock);
    } catch (const std::exception& e) {
      // An internal failure (e.g. out of memory) ends the requests in flight, not the server.
      for (auto& seq : running) finish(*seq, "error", std::string("internal error: ") + e.what());
      running.clear();
    }
    deliver(lock);
    if (waiting.empty() && running.empty()) idle.notify_all();
  }
  for (auto& seq : running) finish(*seq, "abort");
  for (auto& seq : waiting) finish(*seq, "abort");
  running.clear();
  waiting.clear();
  deliver(lock);
  idle.notify_all();
}

void Engine::Impl::step(std::unique_lock<std::mutex>& lock) {
  // 1. Cancellations and timeouts.
  const auto now = Clock::now();
  auto should_end = [&](Sequence& seq) -> std::string {
    if (std::find(cancelled.begin(), cancelled.end(), seq.id) != cancelled.end()) return "abort";
    if (seq.params.timeout_seconds > 0 &&
        std::chrono::duration<double>(now - seq.arrival).count() > seq.params.timeout_seconds)
      return "timeout";
    return "";
  };
  for (auto it = running.begin(); it != running.end();) {
    const std::string reason = should_end(**it);
    if (reason.empty()) { ++it; continue; }
    finish(**it, reason);
    it = running.erase(it);
  }
  for (auto it = waiting.begin(); it != waiting.end();) {
    const std::string reason = should_end(**it);
    if (reason.empty()) { ++it; continue; }
    finish(**it, reason);
    it = waiting.erase(it);
  }
  cancelled.clear();

  // 2. Schedule: running sequences (decodes, then unfinished prefills), then admissions. A
  // speculative decode takes 1 + its drafts from the budget and in blocks.
  std::vector<Scheduled> scheduled;
  int budget = config.max_batch_tokens;
  const auto decodes = std::count_if(running.begin(), running.end(), [](const auto& r) { return r->pending() == 1; });
  const bool speculate = config.speculative_max_batch <= 0 || decodes <= config.speculative_max_batch;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto it = running.begin(); it != running.end() && budget > 0;) {
      Sequence& seq = **it;
      const bool is_decode = seq.pending() == 1;
      if ((pass == 0) != is_decode) { ++it; continue; }
      const int drafts = is_decode && speculate ? std::min(draft_budget(seq), budget - 1) : 0;
      const int count = is_decode ? 1 + drafts : std::min(seq.pending(), budget);
      bool ok = ensure_blocks(seq, seq.num_computed + count);
      while (!ok && preempt_one(&seq)) ok = ensure_blocks(seq, seq.num_computed + count);
      if (!ok) {  // nothing left to preempt: this one waits for memory itself
        std::unique_ptr<Sequence> self = std::move(*it);
        it = running.erase(it);
        release_blocks(*self);
        waiting.push_front(std::move(self));
        ++counters.num_preemptions;
        continue;
      }
      scheduled.emplace_back(&seq, count, drafts);
      budget -= count;
      ++it;
    }
  }
  // A preemption above may have removed a sequence already scheduled: keep only live ones.
  std::erase_if(scheduled, [&](const Scheduled& s) {
    return std::none_of(running.begin(), running.end(), [&](const auto& r) { return r.get() == s.seq; });
  });
  while (!waiting.empty() && budget > 0 && static_cast<int>(running.size()) < config.max_num_seqs) {
    Sequence& seq = *waiting.front();
    if (seq.block_table.empty() && config.enable_prefix_cache) {
      seq.block_table = prefix_cache.match(seq.tokens);
      seq.num_computed = static_cast<int>(seq.block_table.size()) * config.block_size;
      seq.mtp_next = seq.num_computed;  // the cached blocks' draft rows are the writer's
      seq.cached_blocks = static_cast<int>(seq.block_table.size());
      if (!seq.admitted_once) seq.cached_prompt_tokens = seq.num_computed;
    }
    const int count = std::min(seq.pending(), budget);
    if (!ensure_blocks(seq, seq.num_computed + count)) {
      if (running.empty() && scheduled.empty()) {  // can never fit: fail it rather than stall
        std::unique_ptr<Sequence> self = std::move(waiting.front());
        waiting.pop_front();
        finish(*self, "error", "the KV cache is too small for this request");
        continue;
      }
      release_blocks(seq);  // hold nothing while waiting for running requests to free blocks
      break;
    }
    if (!seq.admitted_once) {
      counters.prompt_tokens_total += seq.prompt_len;
      if (config.enable_prefix_cache) prefix_cache.record_lookup(seq.prompt_len, seq.cached_prompt_tokens);
    }
    seq.admitted_once = true;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    scheduled.emplace_back(running.back().get(), count);
    budget -= count;
  }
  if (scheduled.empty()) return;
  if (config.speculative_steps > 0) draft(lock, scheduled);

  // 3. One forward over the batch: speculative decodes verify [pending token, drafts] with
  // logits for each; other sequences need logits only when their tokens are all computed.
  model::ForwardBatch batch;
  for (Scheduled& s : scheduled) {
    Sequence& seq = *s.seq;
    if (s.drafts > 0) {
      std::vector<int32_t> verify = {seq.tokens.back()};
      verify.insert(verify.end(), s.draft_tokens.begin(), s.draft_tokens.end());
      batch.add_sequence(verify, seq.num_computed, seq.block_table, config.block_size, true);
      continue;
    }
    const bool completes = seq.num_computed + s.count == static_cast<int>(seq.tokens.size());
    batch.add_sequence(std::vector<int32_t>(seq.tokens.begin() + seq.num_computed,
                                            seq.tokens.begin() + seq.num_computed + s.count),
                       seq.num_computed, seq.block_table, config.block_size, false);
    if (!completes) batch.logits_tokens.pop_back();
  }
  // What each logits row returns: greedy requests need its argmax, plainly sampled ones a token
  // the runner draws with the sequence's next uniform value, others (penalties, logprobs,
  // verifying sampled drafts) the whole row.
  std::vector<model::RowOutput> outputs;
  std::vector<int64_t> first_row(scheduled.size(), -1);  // each sequence's first logits row, if any
  for (size_t i = 0; i < scheduled.size(); ++i) {
    const Scheduled& s = scheduled[i];
    Sequence& seq = *s.seq;
    if (s.drafts == 0 && seq.num_computed + s.count < static_cast<int>(seq.tokens.size())) continue;
    first_row[i] = static_cast<int64_t>(outputs.size());
    if (s.drafts > 0) outputs.insert(outputs.end(), s.drafts + 1, verdict_output(seq.params));
    else outputs.push_back(next_token_output(seq));
  }
  model::StepLogits logits;
  std::string error;
  model::ForwardTrace trace;
  trace.record_layers = false;  // the last hidden states feed the MTP entries
  unlocked(lock, [&] {
    try {
      logits = runner->forward_selected(batch, outputs, config.speculative_steps > 0 ? &trace : nullptr);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  ++counters.steps;

  // 4. Advance, sample or verify, report; finished sequences leave. Rows that came back whole
  // (penalties, logprobs) draw their tokens first, in parallel: each sequence has its own
  // sampler, and a draw over GLM's vocabulary takes about a millisecond.
  const int64_t hidden = runner->config().hidden_size;
  std::vector<int32_t> drawn(scheduled.size(), -1);
  std::vector<size_t> draws;  // sequences whose next token is drawn here
  for (size_t i = 0; i < scheduled.size(); ++i)
    if (error.empty() && scheduled[i].drafts == 0 && first_row[i] >= 0 && logits.row(first_row[i])) draws.push_back(i);
#pragma omp parallel for schedule(dynamic) if (draws.size() > 1)
  for (int64_t d = 0; d < static_cast<int64_t>(draws.size()); ++d)
    drawn[draws[d]] = draw_token(*scheduled[draws[d]].seq, logits.row(first_row[draws[d]]));

  std::vector<Sequence*> done;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Scheduled& s = scheduled[i];
    Sequence& seq = *s.seq;
    if (!error.empty()) {
      finish(seq, "error", error);
      done.push_back(&seq);
      continue;
    }
    const float* seq_hidden = config.speculative_steps > 0
                                  ? trace.last_hidden.data() + int64_t{batch.sequences[i].first_token} * hidden
                                  : nullptr;
    if (s.drafts > 0) {
      verify(s, logits, first_row[i], seq_hidden, done);
      continue;
    }
    if (seq.speculates) seq.mtp_hidden.insert(seq.mtp_hidden.end(), seq_hidden, seq_hidden + s.count * hidden);
    seq.num_computed += s.count;
    cache_full_blocks(seq);
    if (first_row[i] >= 0) {
      const int32_t token = drawn[i] >= 0 ? drawn[i] : logits.token[first_row[i]];
      if (report_token(seq, token, logits.row(first_row[i]))) done.push_back(&seq);
    }
  }
  for (Sequence* seq : done) {
    release_blocks(*seq);
    running.remove_if([seq](const auto& r) { return r.get() == seq; });
  }
}

int Engine::Impl::draft_budget(const Sequence& seq) const {
  if (!seq.speculates) return 0;
  // Every kept draft and the token after them must fit max_tokens and max_model_len.
  const int tokens_left = seq.params.max_tokens - seq.num_generated();
  const int positions_left = config.max_model_len - static_cast<int>(seq.tokens.size());
  return std::max(0, std::min({config.speculative_steps, tokens_left - 1, positions_left - 1}));
}

void Engine::Impl::draft(std::unique_lock<std::mutex>& lock, std::vector<Scheduled>& scheduled) {
  const int vocab = runner->config().vocab_size;
  const int64_t hidden = runner->config().hidden_size;
  // The pending entries of every speculating sequence; the last entry of a drafting one gives
  // its first draft. (Sequences in `running` belong to the engine thread: the lock guards the
  // queues and counters, not them, so it is released around the forwards.)
  struct Entries {
    Scheduled* s;
    int begin, end;  // positions whose entries run
  };
  std::vector<Entries> pieces;
  for (Scheduled& s : scheduled) {
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
    // A forward holds at most max_batch_tokens: long runs of entries go in pieces.
    for (int begin = seq.mtp_next; begin < seq.num_computed; begin += config.max_batch_tokens)
      pieces.push_back({&s, begin, std::min(seq.num_computed, begin + config.max_batch_tokens)});
  }
  if (pieces.empty()) return;
  // Each draft is drawn from the layer's distribution under the request's sampling parameters
  // (greedy_only requests take the argmax, which the runner makes where the logits are, and
  // keep no distribution: their verification compares with the target's argmax); draws of
  // different sequences run in parallel (each sequence has its own sampler).
  auto take = [&](Scheduled& s, const model::StepLogits& logits, size_t row) {
    if (!logits.row(row)) {
      s.draft_tokens.push_back(logits.token[row]);
      return;
    }
    s.draft_probs.resize(s.draft_probs.size() + vocab);
    float* q = s.draft_probs.data() + s.draft_probs.size() - vocab;
    Sampler::probabilities(logits.row(row), vocab, s.seq->params.sampling, q);
    s.draft_tokens.push_back(s.seq->sampler.sample_from(q, vocab));
  };
  auto take_all = [&](const std::vector<Scheduled*>& takers, const model::StepLogits& logits) {
#pragma omp parallel for schedule(dynamic) if (takers.size() > 1)
    for (int64_t r = 0; r < static_cast<int64_t>(takers.size()); ++r) take(*takers[r], logits, static_cast<size_t>(r));
  };
  auto draft_outputs = [](const std::vector<Scheduled*>& takers) {
    std::vector<model::RowOutput> outputs;
    for (const Scheduled* s : takers) outputs.push_back(verdict_output(s->seq->params));
    return outputs;
  };

  std::vector<Scheduled*> drafting;  // in the order their first drafts come
  std::vector<float> chain_hidden;   // [drafting, hidden]: the layer's output at each last entry
  for (size_t i = 0; i < pieces.size();) {
    model::ForwardBatch entries;
    std::vector<float> entry_hidden;
    std::vector<Scheduled*> takers;  // drafting sequences with a logits row in this forward
    std::vector<int> last_entry;     // their last entry's token index
    for (; i < pieces.size() && entries.num_tokens() + (pieces[i].end - pieces[i].begin) <= config.max_batch_tokens; ++i) {
      const Entries& e = pieces[i];
      Sequence& seq = *e.s->seq;
      entries.add_sequence(std::vector<int32_t>(seq.tokens.begin() + e.begin + 1, seq.tokens.begin() + e.end + 1),
                           e.begin, seq.block_table, config.block_size, false);
      const bool last_piece = e.end == seq.num_computed;
      if (last_piece && e.s->drafts > 0) {
        takers.push_back(e.s);
        last_entry.push_back(entries.num_tokens() - 1);
      } else {
        entries.logits_tokens.pop_back();
      }
      const float* rows = seq.mtp_hidden.data() + int64_t{e.begin - seq.mtp_next} * hidden;
      entry_hidden.insert(entry_hidden.end(), rows, rows + int64_t{e.end - e.begin} * hidden);
    }
    std::vector<float> out_hidden;
    const model::StepLogits logits = unlocked(lock, [&] {
      return runner->mtp_forward_selected(entries, entry_hidden.data(), draft_outputs(takers), &out_hidden);
    });
    take_all(takers, logits);
    for (size_t d = 0; d < takers.size(); ++d) {
      drafting.push_back(takers[d]);
      const float* row = out_hidden.data() + int64_t{last_entry[d]} * hidden;
      chain_hidden.insert(chain_hidden.end(), row, row + hidden);
    }
  }
  for (const Entries& e : pieces) {
    e.s->seq->mtp_next = e.s->seq->num_computed;
    e.s->seq->mtp_hidden.clear();
  }

  // The chain: (the layer's output hidden, draft k) at the next position gives draft k + 1.
  std::vector<float> out_hidden;
  for (int k = 1; k < config.speculative_steps; ++k) {
    model::ForwardBatch chain;
    std::vector<float> chain_in;
    std::vector<size_t> members;
    std::vector<Scheduled*> takers;
    for (size_t i = 0; i < drafting.size(); ++i) {
      Scheduled& s = *drafting[i];
      if (s.drafts <= k) continue;
      chain.add_sequence({s.draft_tokens.back()}, s.seq->num_computed - 1 + k, s.seq->block_table, config.block_size,
                         false);
      chain_in.insert(chain_in.end(), chain_hidden.begin() + i * hidden, chain_hidden.begin() + (i + 1) * hidden);
      members.push_back(i);
      takers.push_back(&s);
    }
    if (members.empty()) break;
    const model::StepLogits logits = unlocked(lock, [&] {
      return runner->mtp_forward_selected(chain, chain_in.data(), draft_outputs(takers), &out_hidden);
    });
    take_all(takers, logits);
    for (size_t m = 0; m < members.size(); ++m)
      std::copy_n(out_hidden.data() + m * hidden, hidden, chain_hidden.data() + members[m] * hidden);
  }
}

// A speculative decode's verdict: logits [drafts + 1, vocab] and the target's hidden states
// [drafts + 1, hidden] of [pending token, drafts]. Kept drafts and the token after them are
// reported one at a time, so a stop lands exactly where plain decoding would stop.
void Engine::Impl::verify(Scheduled& s, const model::StepLogits& logits, int64_t first_row, const float* hidden_rows,
                          std::vector<Sequence*>& done) {
  Sequence& seq = *s.seq;
  const int vocab = runner->config().vocab_size;
  const int64_t hidden = runner->config().hidden_size;
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
  ++counters.spec_drafts;
  counters.spec_draft_tokens += s.drafts;
  counters.spec_accepted_tokens += verdict.accepted;
  for (int k = 0; k < verdict.accepted; ++k) ++counters.spec_accepted_per_position[k];

  for (int k = 0; k <= verdict.accepted; ++k) {
    const int32_t token = k < verdict.accepted ? s.draft_tokens[k] : verdict.next;
    if (report_token(seq, token, logits.row(first_row + k))) {
      done.push_back(&seq);
      return;
    }
  }
  // Verified rows: the pending token and the kept drafts; their hidden states are the next
  // MTP entries (mtp_next is at the pending token's position since draft()).
  seq.mtp_hidden.assign(hidden_rows, hidden_rows + (verdict.accepted + 1) * hidden);
  seq.num_computed += 1 + verdict.accepted;
  cache_full_blocks(seq);
}

Engine::Engine(const model::Glm5Model& model, EngineConfig config)
    : Engine(model::make_cpu_runner(model), std::move(config)) {}

Engine::Engine(std::unique_ptr<model::StepRunner> runner, EngineConfig config)
    : impl_(std::make_unique<Impl>(std::move(runner), std::move(config))) {}

Engine::~Engine() = default;

const EngineConfig& Engine::config() const { return impl_->config; }
const io::ModelConfig& Engine::model_config() const { return impl_->runner->config(); }

uint64_t Engine::submit(RequestParams params, OutputCallback on_output) {
  const io::ModelConfig& mc = impl_->runner->config();
  const int max_len = impl_->config.max_model_len;
  if (params.prompt_ids.empty()) fail("the prompt is empty");
  for (int32_t id : params.prompt_ids)
    if (id < 0 || id >= mc.vocab_size)
      fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(mc.vocab_size) + ")");
  if (params.max_tokens < 1) fail("max_tokens must be at least 1");
  const int64_t total = static_cast<int64_t>(params.prompt_ids.size()) + params.max_tokens;
  if (total > max_len)
    fail("this model's maximum context length is " + std::to_string(max_len) + " tokens, but " +
         std::to_string(params.prompt_ids.size()) + " prompt tokens + " + std::to_string(params.max_tokens) +
         " max_tokens = " + std::to_string(total) + " were requested");
  if (params.top_logprobs > 20) fail("top_logprobs must be at most 20");

  auto seq = std::make_unique<Sequence>();
  seq->tokens = params.prompt_ids;
  seq->prompt_len = static_cast<int>(params.prompt_ids.size());
  seq->sampler = Sampler(params.sampling.seed);
  seq->speculates = impl_->config.speculative_steps > 0 && params.presence_penalty == 0.0f &&
                    params.frequency_penalty == 0.0f && params.repetition_penalty == 1.0f;
  seq->params = std::move(params);
  seq->on_output = std::move(on_output);
  seq->arrival = Clock::now();
  uint64_t id;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->draining || impl_->stopping) fail("the engine is shutting down and takes no new requests");
    if (static_cast<int>(impl_->waiting.size()) >= impl_->config.max_waiting) throw QueueFull{};
    id = seq->id = impl_->next_id++;
    impl_->waiting.push_back(std::move(seq));
  }
  impl_->wake.notify_all();
  return id;
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->cancelled.push_back(request_id);
  }
  impl_->wake.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mutex);
  EngineStats s = impl_->counters;
  s.num_running = static_cast<int>(impl_->running.size());
  s.num_waiting = static_cast<int>(impl_->waiting.size());
  s.num_blocks = impl_->pool.num_blocks();
  s.num_cached_blocks = impl_->prefix_cache.num_cached_blocks();
  const int evictable = impl_->prefix_cache.num_evictable_blocks();
  s.num_free_blocks = impl_->pool.num_free() + evictable;
  s.kv_cache_usage = s.num_blocks > 0 ? 1.0 - static_cast<double>(s.num_free_blocks) / s.num_blocks : 0.0;
  s.prefix_cache_queries = impl_->prefix_cache.query_tokens();
  s.prefix_cache_hits = impl_->prefix_cache.hit_tokens();
  return s;
}

bool Engine::drain(double timeout_seconds) {
  std::unique_lock lock(impl_->mutex);
  impl_->draining = true;
  auto is_idle = [this] { return impl_->waiting.empty() && impl_->running.empty(); };
  if (timeout_seconds <= 0) {
    impl_->idle.wait(lock, is_idle);
    return true;
  }
  if (impl_->idle.wait_for(lock, std::chrono::duration<double>(timeout_seconds), is_idle)) return true;
  for (auto& seq : impl_->running) impl_->cancelled.push_back(seq->id);
  for (auto& seq : impl_->waiting) impl_->cancelled.push_back(seq->id);
  impl_->wake.notify_all();
  impl_->idle.wait(lock, is_idle);
  return false;
}

}  // namespace glms::engine

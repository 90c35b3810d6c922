// The engine's scheduling, without threads (nano-vllm's schedule -> execute -> postprocess):
// which sequences run in the next step on each data-parallel rank (decodes first, then
// unfinished prefills, then admissions under each rank's token budget, sequence limit and free
// blocks, with preemption by recompute), the step's batches, and what the step's outputs do to
// the sequences (sampling, speculative verification, reports). New requests go to the rank whose
// prefix cache holds most of their prompt, else to the least loaded. engine.cpp runs this in
// its loop; tests run it on a fake executor.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine_config.h"
#include "engine/sequence.h"
#include "io/model_config.h"
#include "runtime/executor.h"

namespace glms::engine {

struct ScheduledSequence {
  ScheduledSequence(Sequence* s, int tokens, int num_drafts = 0) : seq(s), count(tokens), drafts(num_drafts) {}
  Sequence* seq;
  int count;                       // tokens this step (1 + drafts for a speculative decode)
  int drafts;                      // draft tokens to verify
  std::vector<int32_t> draft_tokens;
  std::vector<float> draft_probs;  // [drafts, vocab] the distributions they were drawn from
  int64_t first_row = -1;          // its first logits row in its rank's step (-1: none)
  int64_t prompt_rows = -1;        // prompt logprobs: the chunk's first row (one per token), -1: none
};

// What a logits row returns where it decides drafts or a verdict: the argmax for greedy
// requests (made where the logits are), else the whole row (drafts keep their distribution,
// verification compares distributions).
model::RowOutput verdict_output(const RequestParams& p);

// One step: the sequences each data-parallel rank runs.
struct StepPlan {
  std::vector<std::vector<ScheduledSequence>> ranks;
  bool empty() const;
};

class Scheduler {
 public:
  // `blocks_per_rank`: the paged cache of each data-parallel rank, in blocks.
  Scheduler(const EngineConfig& config, const io::ModelConfig& model, int data_parallel, int blocks_per_rank);
  ~Scheduler();

  void add(std::unique_ptr<Sequence> seq);  // to the back of the waiting queue
  bool idle() const { return waiting_.empty() && num_running() == 0; }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const;
  // Ids of every request still queued or running.
  std::vector<uint64_t> request_ids() const;

  // Ends the requests in `cancelled` ("abort") and those past their timeout ("timeout").
  void end_requests(const std::vector<uint64_t>& cancelled, Clock::time_point now);
  // Ends those requests with finish_reason "error" and `error` (a shutdown's deadline).
  void end_with_error(const std::vector<uint64_t>& ids, const std::string& error);
  // The next step.
  StepPlan schedule();
  // The plan as one step per data-parallel rank: batches, and what each logits row returns
  // (sets each scheduled sequence's first_row).
  std::vector<runtime::RankStep> make_steps(StepPlan& plan) const;
  // The step's results (one per rank), or `error` when it failed (its sequences end "error").
  void postprocess(StepPlan& plan, std::vector<runtime::RankResult>& results, const std::string& error);
  // Ends every running request with `reason` (an internal failure), or every request.
  void finish_running(const std::string& reason, const std::string& error);
  void finish_all(const std::string& reason);

  // Frees the cached prefixes no sequence holds on every rank; returns the blocks freed.
  int drop_cached_prefixes();

  // Outputs made since the last call, to deliver outside the engine's lock.
  std::vector<std::pair<OutputCallback, RequestOutput>> take_outbox();
  EngineStats stats() const;

 private:
  struct Rank {
    Rank(int num_blocks, int block_size, bool prefix_caching) : blocks(num_blocks, block_size, prefix_caching) {}
    BlockManager blocks;
    std::list<std::unique_ptr<Sequence>> running;  // in admission order
  };
  void finish(Sequence& seq, const std::string& reason, const std::string& error = "");
  // finish() without the release; request_error: the request's own fault (RequestOutput).
  void emit_end(Sequence& seq, const std::string& reason, const std::string& error, bool request_error = false);
  bool preempt_one(Rank& rank, const Sequence* keep);
  void schedule_running(int r, std::vector<ScheduledSequence>& scheduled, int& budget, bool speculate);
  void admit(StepPlan& plan, std::vector<int>& budgets);
  // Data-parallel ranks in the order a new sequence should try them.
  std::vector<int> rank_preference(const Sequence& seq, const std::vector<int>& budgets) const;
  int draft_budget(const Sequence& seq) const;
  // The next token under the request's adjustments, or kNoTokenLeft when they leave every logit
  // at -inf (allowed_token_ids, bad words, min_tokens and a structured output together).
  int32_t draw_token(Sequence& seq, const float* raw_logits);
  static constexpr int32_t kNoTokenLeft = -2;
  int prompt_rows_left(const std::vector<ScheduledSequence>& step, size_t index, size_t rows_so_far) const;
  void score_prompt(Sequence& seq, const model::StepLogits& logits, int64_t first_row, int count);
  bool report_token(Sequence& seq, int32_t token, const float* raw_logits);
  void verify(ScheduledSequence& s, const model::StepLogits& logits, const float* hidden, std::vector<Sequence*>& done);
  void advance(int r, std::vector<ScheduledSequence>& scheduled, runtime::RankResult& result);
  void emit(const Sequence& seq, RequestOutput out);

  EngineConfig config_;
  io::ModelConfig model_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // FIFO; preempted sequences go to the front
  EngineStats counters_;
  std::vector<std::pair<OutputCallback, RequestOutput>> outbox_;
};

}  // namespace glms::engine

// The scheduler on a fake executor (no model): where requests go on data-parallel ranks (prefix
// affinity, then load), each rank's own limits and blocks, preemption within a rank, and what
// comes back per rank.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/scheduler.h"

using namespace glms;

namespace {

// The "model" answers every logits row with (its last input token + 1) mod vocab.
std::vector<runtime::RankResult> fake_forward(const std::vector<runtime::RankStep>& steps, int vocab) {
  std::vector<runtime::RankResult> results(steps.size());
  for (size_t r = 0; r < steps.size(); ++r) {
    const model::ForwardBatch& b = steps[r].batch;
    results[r].logits.vocab_size = vocab;
    for (int32_t t : b.logits_tokens) results[r].logits.token.push_back((b.token_ids[t] + 1) % vocab);
    results[r].logits.full_row.assign(b.logits_tokens.size(), -1);
  }
  return results;
}

io::ModelConfig small_model() {
  io::ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 4;
  c.eos_token_ids = {0};
  c.max_position_embeddings = 4096;
  return c;
}

std::unique_ptr<engine::Sequence> sequence(uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
  auto seq = std::make_unique<engine::Sequence>();
  seq->id = id;
  seq->tokens = prompt;
  seq->prompt_len = static_cast<int>(prompt.size());
  seq->params.prompt_ids = std::move(prompt);
  seq->params.max_tokens = max_tokens;
  seq->params.sampling.temperature = 0.0f;
  seq->params.ignore_eos = true;
  seq->arrival = engine::Clock::now();
  seq->on_output = [](const engine::RequestOutput&) {};  // outputs reach the outbox
  return seq;
}

std::vector<int32_t> iota_tokens(int count, int first) {
  std::vector<int32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

engine::EngineConfig config_of(int max_num_seqs, int max_batch_tokens, int block_size = 4) {
  engine::EngineConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_batch_tokens = max_batch_tokens;
  c.block_size = block_size;
  c.max_model_len = 4096;
  return c;
}

// Runs steps until the scheduler is idle; returns the finishing outputs by request id.
std::map<uint64_t, engine::RequestOutput> run_to_idle(engine::Scheduler& scheduler, int vocab, int max_steps = 1000) {
  std::map<uint64_t, engine::RequestOutput> finished;
  for (int i = 0; i < max_steps && !scheduler.idle(); ++i) {
    engine::StepPlan plan = scheduler.schedule();
    auto steps = scheduler.make_steps(plan);
    auto results = fake_forward(steps, vocab);
    scheduler.postprocess(plan, results, "");
    for (auto& [callback, out] : scheduler.take_outbox())
      if (out.finished) finished[out.request_id] = out;
  }
  return finished;
}

size_t count_on(const engine::StepPlan& plan, int rank) { return plan.ranks[rank].size(); }

}  // namespace

TEST(Scheduler, SpreadsNewRequestsOverDataParallelRanksByLoad) {
  engine::Scheduler scheduler(config_of(2, 64), small_model(), 2, 64);
  for (uint64_t id = 1; id <= 5; ++id) scheduler.add(sequence(id, iota_tokens(6, 100 * static_cast<int>(id)), 3));
  engine::StepPlan plan = scheduler.schedule();
  EXPECT_EQ(count_on(plan, 0), 2u);  // max_num_seqs is per rank
  EXPECT_EQ(count_on(plan, 1), 2u);
  EXPECT_EQ(scheduler.num_waiting(), 1);
  EXPECT_EQ(plan.ranks[0][0].seq->id, 1u);  // alternating by load: 1 -> 0, 2 -> 1, 3 -> 0, 4 -> 1
  EXPECT_EQ(plan.ranks[1][0].seq->id, 2u);
  auto steps = scheduler.make_steps(plan);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].batch.num_tokens(), 12);
  EXPECT_EQ(steps[1].batch.num_tokens(), 12);
  auto results = fake_forward(steps, 1000);
  scheduler.postprocess(plan, results, "");
  const auto finished = run_to_idle(scheduler, 1000);
  EXPECT_EQ(finished.size(), 5u);
  const engine::EngineStats stats = scheduler.stats();
  ASSERT_EQ(stats.ranks.size(), 2u);
  for (const engine::RankStats& r : stats.ranks) EXPECT_EQ(r.num_free_blocks, r.num_blocks) << "a block leaked";
}

TEST(Scheduler, ARequestGoesWhereItsPrefixIsCached) {
  engine::Scheduler scheduler(config_of(4, 64), small_model(), 3, 64);
  const auto prefix = iota_tokens(16, 500);
  // Three requests land on ranks 0, 1, 2; the one on rank 1 carries the prefix.
  scheduler.add(sequence(1, iota_tokens(8, 10), 2));
  auto with_prefix = prefix;
  with_prefix.push_back(7);
  scheduler.add(sequence(2, with_prefix, 2));
  scheduler.add(sequence(3, iota_tokens(8, 30), 2));
  engine::StepPlan first = scheduler.schedule();
  ASSERT_EQ(count_on(first, 1), 1u);
  ASSERT_EQ(first.ranks[1][0].seq->id, 2u);
  auto steps = scheduler.make_steps(first);
  auto results = fake_forward(steps, 1000);
  scheduler.postprocess(first, results, "");
  run_to_idle(scheduler, 1000);
  // Rank 1 is not the least loaded now (all are idle, it comes second), but it has the prefix.
  auto again = prefix;
  again.push_back(8);
  scheduler.add(sequence(4, again, 2));
  engine::StepPlan second = scheduler.schedule();
  ASSERT_EQ(count_on(second, 1), 1u);
  EXPECT_EQ(second.ranks[1][0].seq->cached_prompt_tokens, 16);
  EXPECT_EQ(second.ranks[1][0].count, 1);  // only the token after the cached blocks runs
}

TEST(Scheduler, EachRankHasItsOwnTokenBudget) {
  engine::Scheduler scheduler(config_of(8, 8), small_model(), 2, 64);
  scheduler.add(sequence(1, iota_tokens(20, 100), 1));
  scheduler.add(sequence(2, iota_tokens(20, 200), 1));
  engine::StepPlan plan = scheduler.schedule();
  ASSERT_EQ(count_on(plan, 0), 1u);
  ASSERT_EQ(count_on(plan, 1), 1u);
  EXPECT_EQ(plan.ranks[0][0].count, 8);  // a chunk of each prompt in the same step
  EXPECT_EQ(plan.ranks[1][0].count, 8);
  auto steps = scheduler.make_steps(plan);
  EXPECT_TRUE(steps[0].batch.logits_tokens.empty());  // unfinished prefills ask for no logits
}

TEST(Scheduler, PreemptionStaysWithinARankAndOutputsStayExact) {
  // Two blocks of 4 per rank: each rank holds one growing sequence at a time.
  engine::Scheduler scheduler(config_of(4, 64, 4), small_model(), 2, 3);
  for (uint64_t id = 1; id <= 4; ++id) scheduler.add(sequence(id, iota_tokens(3, 10 * static_cast<int>(id)), 6));
  const auto finished = run_to_idle(scheduler, 1000);
  ASSERT_EQ(finished.size(), 4u);
  for (const auto& [id, out] : finished) {
    EXPECT_EQ(out.finish_reason, "length") << "request " << id;
    EXPECT_EQ(out.completion_tokens, 6);
  }
  EXPECT_GT(scheduler.stats().num_preemptions, 0);
  for (const engine::RankStats& r : scheduler.stats().ranks) EXPECT_EQ(r.num_free_blocks, r.num_blocks);
}

TEST(Scheduler, CancellationFreesTheRanksBlocksAtOnce) {
  engine::Scheduler scheduler(config_of(4, 64), small_model(), 2, 64);
  scheduler.add(sequence(1, iota_tokens(9, 10), 100));
  scheduler.add(sequence(2, iota_tokens(9, 40), 100));
  engine::StepPlan plan = scheduler.schedule();
  auto steps = scheduler.make_steps(plan);
  auto results = fake_forward(steps, 1000);
  scheduler.postprocess(plan, results, "");
  EXPECT_LT(scheduler.stats().ranks[1].num_free_blocks, 64);
  scheduler.end_requests({2}, engine::Clock::now());
  EXPECT_EQ(scheduler.stats().ranks[1].num_free_blocks, 64);
  EXPECT_EQ(scheduler.num_running(), 1);
  bool aborted = false;
  for (auto& [callback, out] : scheduler.take_outbox()) aborted = aborted || (out.request_id == 2 && out.finish_reason == "abort");
  EXPECT_TRUE(aborted);
}

TEST(Scheduler, AFailedStepEndsOnlyTheRanksThatRan) {
  engine::Scheduler scheduler(config_of(4, 64), small_model(), 2, 64);
  scheduler.add(sequence(1, iota_tokens(5, 10), 4));
  engine::StepPlan plan = scheduler.schedule();
  ASSERT_EQ(count_on(plan, 0), 1u);
  std::vector<runtime::RankResult> none;
  scheduler.postprocess(plan, none, "device lost");
  const auto outputs = scheduler.take_outbox();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].second.finish_reason, "error");
  EXPECT_EQ(outputs[0].second.error, "device lost");
  EXPECT_TRUE(scheduler.idle());
}

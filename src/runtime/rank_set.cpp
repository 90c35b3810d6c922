#include "runtime/rank_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "model/glm5.h"

namespace glms::runtime {

RankSet::RankSet(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner,
                 int first, int count)
    : layout_(layout), groups_(std::move(groups)), first_(first), workers_(count), runners_(count) {
  run_all([&](int local) { runners_[local] = make_runner(first_ + local, groups_->peers(first_ + local)); });
  check_layout(runners_[0]->config(), layout_);
  faults_.resize(static_cast<size_t>(count));
}

RankSet::~RankSet() {
  try {
    run_all([&](int local) { runners_[local].reset(); });
  } catch (...) {
  }
}

void RankSet::allocate(const model::CacheShape& shape) {
  run_all([&](int local) { runners_[local]->allocate(shape); });
}

int RankSet::num_blocks() const {
  int blocks = runners_[0]->num_blocks();
  for (const auto& runner : runners_) blocks = std::min(blocks, runner->num_blocks());
  return blocks;
}

void RankSet::limit_blocks(int blocks) {
  run_all([&](int local) { runners_[local]->limit_blocks(blocks); });
}

std::vector<Executor::RankMemory> RankSet::memory() const {
  std::vector<Executor::RankMemory> out;
  for (const auto& runner : runners_) out.push_back({runner->weight_bytes(), runner->cache_bytes()});
  return out;
}

void RankSet::forward(const std::vector<RankStep>& steps, bool want_hidden, std::vector<RankResult>& results,
                      std::vector<bool>& produced) {
  run_all([&](int local) {
    faults_[static_cast<size_t>(local)].before_step(first_ + local);
    const model::ModelShard s = layout_.shard(first_ + local);
    const RankStep& step = steps[s.dp_rank];
    model::ForwardTrace trace;
    trace.record_layers = false;
    model::StepLogits logits = runners_[local]->forward_selected(step.batch, step.outputs, want_hidden ? &trace : nullptr);
    if (s.tp_rank != 0) return;  // its peers computed the same
    results[s.dp_rank].logits = std::move(logits);
    results[s.dp_rank].hidden = std::move(trace.last_hidden);
    produced[s.dp_rank] = true;
  });
}

void RankSet::mtp_forward(const std::vector<RankStep>& steps, std::vector<RankResult>& results,
                          std::vector<bool>& produced) {
  run_all([&](int local) {
    const model::ModelShard s = layout_.shard(first_ + local);
    const RankStep& step = steps[s.dp_rank];
    std::vector<float> hidden;
    model::StepLogits logits = runners_[local]->mtp_forward_selected(step.batch, step.h_prev, step.outputs, &hidden);
    if (s.tp_rank != 0) return;
    results[s.dp_rank].logits = std::move(logits);
    results[s.dp_rank].hidden = std::move(hidden);
    produced[s.dp_rank] = true;
  });
}

// Runs job(local rank) on every local worker and waits for all. The first rank to fail wakes the
// others out of their collectives; its error is thrown once all have stopped.
template <typename Job>
void RankSet::run_all(const Job& job) {
  if (broken_) fail("the parallel runtime stopped after an earlier failure (" + broken_reason_ + "): restart glmserve");
  std::mutex failure_mutex;
  std::string first_failure;
  for (int local = 0; local < static_cast<int>(workers_.size()); ++local)
    workers_[local].start([&, local] {
      try {
        job(local);
      } catch (const std::exception& e) {
        const std::string message =
            layout_.world_size() > 1 ? fmt::format("rank {}: {}", first_ + local, e.what()) : std::string(e.what());
        {
          std::lock_guard lock(failure_mutex);
          if (first_failure.empty()) first_failure = message;
        }
        groups_->abort(message);
        throw;
      }
    });
  bool failed = false;
  for (Worker& worker : workers_) failed = worker.wait() != nullptr || failed;
  if (!failed) return;
  if (!groups_->reset()) {
    broken_ = true;
    broken_reason_ = first_failure;
  }
  fail(first_failure.empty() ? "a rank failed" : first_failure);
}

void fill_dp_peers(const ParallelLayout& layout, std::vector<RankStep>& steps) {
  if (static_cast<int>(steps.size()) != layout.data_parallel)
    fail(fmt::format("a step of this layout takes {} batches (one per data-parallel rank), got {}", layout.data_parallel,
                     steps.size()));
  if (layout.data_parallel == 1) return;
  std::vector<model::ForwardBatch*> batches;
  for (RankStep& step : steps) batches.push_back(&step.batch);
  model::set_data_parallel_peers(batches);
}

}  // namespace glms::runtime

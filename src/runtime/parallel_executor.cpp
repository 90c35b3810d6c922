#include "runtime/parallel_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "model/glm5.h"
#include "runtime/worker.h"

namespace glms::runtime {

namespace {

class ParallelExecutor : public Executor {
 public:
  ParallelExecutor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner)
      : layout_(layout), groups_(std::move(groups)), workers_(layout.world_size()), runners_(layout.world_size()) {
    run_all([&](int rank) { runners_[rank] = make_runner(rank, groups_->peers(rank)); });
    check_layout(runners_[0]->config(), layout_);
  }
  ~ParallelExecutor() override {
    // The runners are destroyed on their own threads (a device rank frees its memory there).
    try {
      run_all([&](int rank) { runners_[rank].reset(); });
    } catch (...) {
    }
  }

  const io::ModelConfig& config() const override { return runners_[0]->config(); }
  const ParallelLayout& layout() const override { return layout_; }
  std::string device() const override { return runners_[0]->device(); }
  int64_t cache_bytes_per_token() const override { return runners_[0]->cache_bytes_per_token(); }
  void allocate(const model::CacheShape& shape) override {
    run_all([&](int rank) { runners_[rank]->allocate(shape); });
    int blocks = runners_[0]->num_blocks();
    for (const auto& runner : runners_) blocks = std::min(blocks, runner->num_blocks());
    run_all([&](int rank) { runners_[rank]->limit_blocks(blocks); });  // peers share block ids
  }
  int num_blocks() const override { return runners_[0]->num_blocks(); }
  std::vector<RankMemory> memory() const override {
    std::vector<RankMemory> out;
    for (const auto& runner : runners_) out.push_back({runner->weight_bytes(), runner->cache_bytes()});
    return out;
  }
  bool has_mtp() const override { return runners_[0]->has_mtp(); }

  std::vector<RankResult> forward(std::vector<RankStep>& steps, bool want_hidden) override {
    prepare(steps);
    std::vector<RankResult> results(layout_.data_parallel);
    run_all([&](int rank) {
      const model::ModelShard s = layout_.shard(rank);
      const RankStep& step = steps[s.dp_rank];
      model::ForwardTrace trace;
      trace.record_layers = false;
      model::StepLogits logits = runners_[rank]->forward_selected(step.batch, step.outputs, want_hidden ? &trace : nullptr);
      if (s.tp_rank != 0) return;  // its peers computed the same
      results[s.dp_rank].logits = std::move(logits);
      results[s.dp_rank].hidden = std::move(trace.last_hidden);
    });
    return results;
  }

  std::vector<RankResult> mtp_forward(std::vector<RankStep>& steps) override {
    prepare(steps);
    std::vector<RankResult> results(layout_.data_parallel);
    run_all([&](int rank) {
      const model::ModelShard s = layout_.shard(rank);
      const RankStep& step = steps[s.dp_rank];
      std::vector<float> hidden;
      model::StepLogits logits = runners_[rank]->mtp_forward_selected(step.batch, step.h_prev, step.outputs, &hidden);
      if (s.tp_rank != 0) return;
      results[s.dp_rank].logits = std::move(logits);
      results[s.dp_rank].hidden = std::move(hidden);
    });
    return results;
  }

 private:
  // Every rank's batch learns every rank's token count (the MoE layers gather them).
  void prepare(std::vector<RankStep>& steps) const {
    if (static_cast<int>(steps.size()) != layout_.data_parallel)
      fail(fmt::format("a step of this layout takes {} batches (one per data-parallel rank), got {}",
                       layout_.data_parallel, steps.size()));
    if (layout_.data_parallel == 1) return;
    std::vector<int32_t> counts;
    for (const RankStep& step : steps) counts.push_back(step.batch.num_tokens());
    for (RankStep& step : steps) step.batch.dp_tokens = counts;
  }

  // Runs job(rank) on every rank's worker and waits for all. The first rank to fail wakes the
  // others out of their collectives; its error is thrown once all have stopped.
  template <typename Job>
  void run_all(const Job& job) {
    if (broken_) fail("the parallel runtime stopped after an earlier failure (" + broken_reason_ + "): restart glmserve");
    std::mutex failure_mutex;
    std::string first_failure;
    for (int rank = 0; rank < static_cast<int>(workers_.size()); ++rank)
      workers_[rank].start([&, rank] {
        try {
          job(rank);
        } catch (const std::exception& e) {
          const std::string message =
              layout_.world_size() > 1 ? fmt::format("rank {}: {}", rank, e.what()) : std::string(e.what());
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

  ParallelLayout layout_;
  std::unique_ptr<RankGroups> groups_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<model::StepRunner>> runners_;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace

std::unique_ptr<Executor> make_parallel_executor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups,
                                                 const RunnerFactory& make_runner) {
  return std::make_unique<ParallelExecutor>(layout, std::move(groups), make_runner);
}

}  // namespace glms::runtime

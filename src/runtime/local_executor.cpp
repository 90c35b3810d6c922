// The one-rank executor (today's single-device path) and the rank-zero StepRunner view.
#include "core/error.h"
#include "model/glm5.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"

namespace glms::runtime {

namespace {

class LocalExecutor : public Executor {
 public:
  explicit LocalExecutor(std::unique_ptr<model::StepRunner> runner) : runner_(std::move(runner)) {}
  const io::ModelConfig& config() const override { return runner_->config(); }
  const ParallelLayout& layout() const override { return layout_; }
  std::string device() const override { return runner_->device(); }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    return runner_->cache_bytes_per_token(dtype, mtp);
  }
  void allocate(const model::CacheShape& shape) override { runner_->allocate(shape); }
  int num_blocks() const override { return runner_->num_blocks(); }
  std::vector<RankMemory> memory() const override { return {{runner_->weight_bytes(), runner_->cache_bytes()}}; }
  bool has_mtp() const override { return runner_->has_mtp(); }

  std::vector<RankResult> forward(std::vector<RankStep>& steps, bool want_hidden) override {
    GLMS_CHECK(steps.size() == 1, "one rank takes one batch");
    fault_.before_step(0);
    std::vector<RankResult> results(1);
    model::ForwardTrace trace;
    trace.record_layers = false;
    results[0].logits = runner_->forward_selected(steps[0].batch, steps[0].outputs, want_hidden ? &trace : nullptr);
    results[0].hidden = std::move(trace.last_hidden);
    return results;
  }
  std::vector<RankResult> mtp_forward(std::vector<RankStep>& steps) override {
    GLMS_CHECK(steps.size() == 1, "one rank takes one batch");
    std::vector<RankResult> results(1);
    results[0].logits =
        runner_->mtp_forward_selected(steps[0].batch, steps[0].h_prev, steps[0].outputs, &results[0].hidden);
    return results;
  }

 private:
  std::unique_ptr<model::StepRunner> runner_;
  FaultInjection fault_;
  ParallelLayout layout_;
};

// StepRunner's forward() and mtp_forward() return every logits row: ask for them whole.
std::vector<model::RowOutput> whole_rows(const model::ForwardBatch& batch) {
  std::vector<model::RowOutput> outputs(batch.logits_tokens.size());
  for (model::RowOutput& o : outputs) o.kind = model::RowOutput::Kind::kLogits;
  return outputs;
}

class RankZeroRunner : public model::StepRunner {
 public:
  explicit RankZeroRunner(Executor& executor) : executor_(executor) {}
  const io::ModelConfig& config() const override { return executor_.config(); }
  std::string device() const override { return executor_.device(); }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    return executor_.cache_bytes_per_token(dtype, mtp);
  }
  void allocate(const model::CacheShape& shape) override { executor_.allocate(shape); }
  int num_blocks() const override { return executor_.num_blocks(); }
  void limit_blocks(int) override { fail("limit_blocks: the executor's ranks agree on their cache themselves"); }
  bool has_mtp() const override { return executor_.has_mtp(); }

  std::vector<float> forward(const model::ForwardBatch& batch, model::ForwardTrace* trace) override {
    return forward_selected(batch, whole_rows(batch), trace).full;
  }
  model::StepLogits forward_selected(const model::ForwardBatch& batch, const std::vector<model::RowOutput>& outputs,
                                     model::ForwardTrace* trace) override {
    if (trace && trace->record_layers)
      fail("a parallel layout records only the last hidden states (ForwardTrace::record_layers = false)");
    std::vector<RankStep> steps = on_rank_zero(batch, outputs);
    std::vector<RankResult> results = executor_.forward(steps, trace != nullptr);
    if (trace) trace->last_hidden = std::move(results[0].hidden);
    return std::move(results[0].logits);
  }
  std::vector<float> mtp_forward(const model::ForwardBatch& batch, const float* h_prev,
                                 std::vector<float>* h_out) override {
    return mtp_forward_selected(batch, h_prev, whole_rows(batch), h_out).full;
  }
  model::StepLogits mtp_forward_selected(const model::ForwardBatch& batch, const float* h_prev,
                                         const std::vector<model::RowOutput>& outputs,
                                         std::vector<float>* h_out) override {
    std::vector<RankStep> steps = on_rank_zero(batch, outputs);
    steps[0].h_prev = h_prev;
    std::vector<RankResult> results = executor_.mtp_forward(steps);
    if (h_out) *h_out = std::move(results[0].hidden);
    return std::move(results[0].logits);
  }

 private:
  std::vector<RankStep> on_rank_zero(const model::ForwardBatch& batch, const std::vector<model::RowOutput>& outputs) {
    std::vector<RankStep> steps(executor_.data_parallel_size());
    steps[0].batch = batch;
    steps[0].outputs = outputs;
    return steps;
  }
  Executor& executor_;
};

}  // namespace

std::unique_ptr<Executor> make_local_executor(std::unique_ptr<model::StepRunner> runner) {
  return std::make_unique<LocalExecutor>(std::move(runner));
}

std::unique_ptr<model::StepRunner> rank_zero_runner(Executor& executor) {
  return std::make_unique<RankZeroRunner>(executor);
}

}  // namespace glms::runtime

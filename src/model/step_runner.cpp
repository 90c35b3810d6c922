#include "model/step_runner.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "model/glm5.h"
#include "ops/ops.h"

namespace glms::model {

namespace {

class CpuRunner : public StepRunner {
 public:
  explicit CpuRunner(std::shared_ptr<const Glm5Model> model) : owned_(std::move(model)), model_(*owned_) {}
  const io::ModelConfig& config() const override { return model_.config(); }
  std::string device() const override { return "cpu"; }
  // fp32 storage whatever the dtype (an FP8 cache's values are rounded in place).
  int64_t cache_bytes_per_token(kv::CacheDtype, bool mtp) const override {
    return model_.cache_layout(1).bytes_per_token() +
           (mtp && has_mtp() ? model_.mtp_cache_layout(1).bytes_per_token() : 0);
  }
  void allocate(const CacheShape& shape) override {
    if (shape.num_blocks <= 0) fail("the CPU cache needs its size in blocks (--kv-cache-memory)");
    cache_.reset();
    mtp_cache_.reset();
    kv::CacheLayout layout = model_.cache_layout(shape.block_size);
    layout.dtype = shape.cache_dtype;
    cache_.emplace(std::move(layout), shape.num_blocks);
    if (shape.mtp && has_mtp()) {
      kv::CacheLayout mtp_layout = model_.mtp_cache_layout(shape.block_size);
      mtp_layout.dtype = shape.cache_dtype;
      mtp_cache_.emplace(std::move(mtp_layout), shape.num_blocks);
    }
    num_blocks_ = shape.num_blocks;
  }
  int num_blocks() const override { return num_blocks_; }
  void limit_blocks(int blocks) override { num_blocks_ = std::min(num_blocks_, blocks); }
  int64_t cache_bytes() const override {
    int64_t bytes = 0;
    for (const auto* cache : {&cache_, &mtp_cache_})
      if (*cache) bytes += (*cache)->layout().bytes_per_token() * (*cache)->block_size() * (*cache)->num_blocks();
    return bytes;
  }
  bool has_mtp() const override { return model_.num_mtp_layers() > 0; }
  std::vector<float> mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out) override {
    GLMS_CHECK(mtp_cache_.has_value(), "StepRunner::mtp_forward without an MTP cache (CacheShape::mtp)");
    return model_.mtp_forward(0, batch, h_prev, *mtp_cache_, h_out);
  }
  std::vector<float> forward(const ForwardBatch& batch, ForwardTrace* trace) override {
    GLMS_CHECK(cache_.has_value(), "StepRunner::forward before allocate");
    return model_.forward(batch, *cache_, trace);
  }

 private:
  std::shared_ptr<const Glm5Model> owned_;
  const Glm5Model& model_;
  std::optional<kv::PagedLatentCache> cache_;
  std::optional<kv::PagedLatentCache> mtp_cache_;
  int num_blocks_ = 0;
};

// `row` [vocab] with every token whose bit in `mask` ([(vocab + 31) / 32] words) is clear set to
// -infinity, in `scratch`.
const float* masked_row(const float* row, int vocab, const std::vector<uint32_t>& mask, std::vector<float>& scratch) {
  scratch.assign(row, row + vocab);
  for (int t = 0; t < vocab; ++t)
    if (!(mask[static_cast<size_t>(t) / 32] >> (t % 32) & 1u)) scratch[t] = -std::numeric_limits<float>::infinity();
  return scratch.data();
}

}  // namespace

std::vector<float> StepRunner::mtp_forward(const ForwardBatch&, const float*, std::vector<float>*) {
  fail("the " + device() + " runner has no MTP draft layer (speculative decoding runs on the CPU for now)");
}

StepLogits StepRunner::forward_selected(const ForwardBatch& batch, const std::vector<RowOutput>& outputs,
                                        ForwardTrace* trace) {
  GLMS_CHECK(outputs.size() == batch.logits_tokens.size(), "forward_selected: one output per logits row");
  const std::vector<float> logits = forward(batch, trace);
  return select_logits(logits.data(), config().vocab_size, outputs);
}

StepLogits StepRunner::mtp_forward_selected(const ForwardBatch& batch, const float* h_prev,
                                            const std::vector<RowOutput>& outputs, std::vector<float>* h_out) {
  GLMS_CHECK(outputs.size() == batch.logits_tokens.size(), "mtp_forward_selected: one output per logits row");
  const std::vector<float> logits = mtp_forward(batch, h_prev, h_out);
  return select_logits(logits.data(), config().vocab_size, outputs);
}

ops::SamplingFilter sampling_filter(const RowOutput& output) {
  return {output.temperature, output.top_k, output.top_p, output.min_p};
}

StepLogits select_logits(const float* logits, int vocab_size, const std::vector<RowOutput>& outputs) {
  StepLogits out;
  out.vocab_size = vocab_size;
  const int64_t rows = static_cast<int64_t>(outputs.size());
  out.token.resize(rows);
  out.full_row.assign(rows, -1);
  int32_t full_rows = 0;
  // Masks made on demand are made here, one row at a time (a constraint is not shared between
  // threads), before the rows go out in parallel.
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> masks(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    if (outputs[i].kind == RowOutput::Kind::kLogits) out.full_row[i] = full_rows++;
    masks[i] = outputs[i].resolved_mask();
    GLMS_CHECK(!masks[i] || masks[i]->size() == static_cast<size_t>((vocab_size + 31) / 32),
               "forward_selected: a row's token mask needs (vocab + 31) / 32 words");
  }
  out.full.resize(static_cast<size_t>(full_rows) * vocab_size);
  // Rows in parallel: a draw over a vocabulary of 154880 takes about a millisecond.
#pragma omp parallel for schedule(dynamic) if (rows > 1)
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> masked;
    const float* row = logits + i * vocab_size;
    if (masks[i]) row = masked_row(row, vocab_size, *masks[i], masked);
    out.token[i] = outputs[i].kind == RowOutput::Kind::kSample
                       ? ops::sample_row(row, vocab_size, sampling_filter(outputs[i]), outputs[i].canonical)
                       : ops::argmax(row, vocab_size);
    if (out.full_row[i] >= 0) std::copy(row, row + vocab_size, out.full.begin() + int64_t{out.full_row[i]} * vocab_size);
  }
  return out;
}

std::unique_ptr<StepRunner> make_cpu_runner(const Glm5Model& model) {
  return std::make_unique<CpuRunner>(std::shared_ptr<const Glm5Model>(&model, [](const Glm5Model*) {}));
}

std::unique_ptr<StepRunner> make_cpu_runner(std::shared_ptr<const Glm5Model> model) {
  return std::make_unique<CpuRunner>(std::move(model));
}

}  // namespace glms::model

#include "model/step_runner.h"

#include <optional>

#include "core/error.h"
#include "model/glm5.h"

namespace glms::model {

namespace {

class CpuRunner : public StepRunner {
 public:
  explicit CpuRunner(const Glm5Model& model) : model_(model) {}
  const io::ModelConfig& config() const override { return model_.config(); }
  std::string device() const override { return "cpu"; }
  int64_t cache_bytes_per_token() const override { return model_.cache_layout(1).bytes_per_token(); }
  void allocate(const CacheShape& shape) override {
    cache_.reset();
    mtp_cache_.reset();
    cache_.emplace(model_.cache_layout(shape.block_size), shape.num_blocks);
    if (shape.mtp && has_mtp()) mtp_cache_.emplace(model_.mtp_cache_layout(shape.block_size), shape.num_blocks);
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
  const Glm5Model& model_;
  std::optional<kv::PagedLatentCache> cache_;
  std::optional<kv::PagedLatentCache> mtp_cache_;
};

}  // namespace

std::vector<float> StepRunner::mtp_forward(const ForwardBatch&, const float*, std::vector<float>*) {
  fail("the " + device() + " runner has no MTP draft layer (speculative decoding runs on the CPU for now)");
}

std::unique_ptr<StepRunner> make_cpu_runner(const Glm5Model& model) { return std::make_unique<CpuRunner>(model); }

}  // namespace glms::model

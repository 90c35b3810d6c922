// The CUDA StepRunner: CudaGlm5Model behind the interface the engine and generate() use.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "model/glm5.h"
#include "model/cuda/model.h"
#include "model/cuda/out_of_memory.h"
#include "model/cuda/weights.h"

namespace glms::model {

namespace {

class CudaRunner : public StepRunner {
 public:
  CudaRunner(io::ModelConfig config, std::optional<ModelWeights> weights, uint64_t seed,
             ops::WeightFormat experts_format, ModelShard shard, Peers peers, CudaRunnerOptions runner)
      : config_(std::move(config)),
        weights_(std::move(weights)),
        seed_(seed),
        experts_format_(experts_format),
        shard_(shard),
        peers_(peers),
        runner_(runner) {
    check_cuda_supported(config_);
  }
  const io::ModelConfig& config() const override { return config_; }
  std::string device() const override { return "cuda"; }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    const bool drafts = mtp && has_mtp();  // has_mtp: an MTP layer with its own indexer
    return cuda_cache_bytes_per_token(config_, dtype, drafts, drafts);
  }
  void allocate(const CacheShape& shape) override {
    CudaModelOptions options;
    options.cache_dtype = shape.cache_dtype;
    options.block_size = shape.block_size;
    options.num_blocks = shape.num_blocks;
    options.gpu_memory_utilization = shape.gpu_memory_utilization;
    options.max_tokens = shape.max_tokens;
    options.max_sequences = shape.max_sequences;
    options.max_context = shape.max_context;
    options.max_logits = shape.max_logits > 0 ? shape.max_logits : shape.max_sequences;
    options.mtp = shape.mtp;
    options.linear_weights = runner_.linears;
    model_.reset();
    const auto start = std::chrono::steady_clock::now();
    const int rank = shard_.world_rank();
    // A line at every tenth of the layers: uploading a full checkpoint takes minutes.
    auto progress = [rank, start](int done, int total, int64_t bytes) {
      if (total < 10 || (done != total && done * 10 / total == (done - 1) * 10 / total)) return;
      std::fprintf(stderr, "glmserve: rank %d: uploading weights, %d/%d layers, %.1f GiB, %.1f s\n", rank, done, total,
                   static_cast<double>(bytes) / (1 << 30),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    };
    try {
      if (weights_) model_ = std::make_unique<CudaGlm5Model>(*weights_, options, peers_, progress);
      else model_ = CudaGlm5Model::synthetic(config_, seed_, options, experts_format_, shard_, peers_);
    } catch (const Error& e) {
      if (!is_device_out_of_memory(e)) throw;
      // Name the rank and what to change: the plan knows what each layout needs.
      fail(std::string(e.what()) + ", on rank " + std::to_string(rank) + " (" + shard_.describe() +
           "). `glmserve plan` shows what each layout needs; use more "
           "GPUs (-tp N, or -dp N --enable-expert-parallel), FP8 linear layers (--quantization fp8) or MXFP4 "
           "experts, a smaller cache or step (--kv-cache-memory, --gpu-memory-utilization, "
           "--max-num-batched-tokens, --max-num-seqs), or free the GPU of other processes");
    }
    const CudaMemoryReport m = model_->memory_report();
    auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
    std::fprintf(stderr, "glmserve: rank %d: %.2f GiB of %s weights and a %.2f GiB KV cache on the GPU in %.1f s\n",
                 rank, gib(m.weights), weights_ ? "checkpoint" : "synthetic", gib(m.cache),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const auto [linears, fp8_linears] = model_->linear_matrices();
    if (fp8_linears > 0 || runner_.linears == CudaLinearWeights::kFp8)
      std::fprintf(stderr,
                   "glmserve: rank %d: %d of %d linear-layer matrices in block FP8 (the others bf16: rows not a "
                   "multiple of 16 or columns of 128)\n",
                   rank, fp8_linears, linears);
    if (m.budget > 0)
      std::fprintf(stderr,
                   "glmserve: rank %d: GPU memory budget %.2f of %.2f GiB (--gpu-memory-utilization %.2f) = weights "
                   "%.2f + workspaces %.2f + CUDA runtime %.2f + margin %.2f + KV cache %.2f GiB (%d blocks)\n",
                   rank, gib(m.budget), gib(m.device_total), shape.gpu_memory_utilization, gib(m.weights),
                   gib(m.workspaces), gib(m.runtime()), gib(kCudaMemoryMarginBytes), gib(m.cache),
                   model_->options().num_blocks);
  }
  int num_blocks() const override { return model_ ? model_->options().num_blocks : 0; }
  void limit_blocks(int blocks) override {
    GLMS_CHECK(model_ != nullptr, "StepRunner::limit_blocks before allocate");
    model_->limit_blocks(blocks);
  }
  int64_t weight_bytes() const override { return model_ ? model_->weight_bytes() : 0; }
  int64_t cache_bytes() const override { return model_ ? model_->cache_bytes() : 0; }
  std::vector<float> forward(const ForwardBatch& batch, ForwardTrace* trace) override {
    GLMS_CHECK(model_ != nullptr, "StepRunner::forward before allocate");
    if (trace && trace->record_layers)
      fail("the CUDA runner records only the last hidden states (ForwardTrace::record_layers = false)");
    return model_->forward(batch, runner_.cuda_graphs, trace ? &trace->last_hidden : nullptr);
  }
  StepLogits forward_selected(const ForwardBatch& batch, const std::vector<RowOutput>& outputs,
                              ForwardTrace* trace) override {
    GLMS_CHECK(model_ != nullptr, "StepRunner::forward_selected before allocate");
    if (trace && trace->record_layers)
      fail("the CUDA runner records only the last hidden states (ForwardTrace::record_layers = false)");
    return model_->forward_selected(batch, outputs, runner_.cuda_graphs, trace ? &trace->last_hidden : nullptr);
  }
  // A checkpoint's MTP layer with its own indexer; synthetic weights make one (indexer and all)
  // wherever the config has one.
  bool has_mtp() const override {
    if (!weights_) return config_.num_nextn_predict_layers > 0;
    return !weights_->mtp.empty() && weights_->mtp[0].block.attention.has_indexer;
  }
  std::vector<float> mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out) override {
    GLMS_CHECK(model_ != nullptr, "StepRunner::mtp_forward before allocate");
    return model_->mtp_forward(batch, h_prev, h_out);
  }
  StepLogits mtp_forward_selected(const ForwardBatch& batch, const float* h_prev, const std::vector<RowOutput>& outputs,
                                  std::vector<float>* h_out) override {
    GLMS_CHECK(model_ != nullptr, "StepRunner::mtp_forward_selected before allocate");
    return model_->mtp_forward_selected(batch, h_prev, outputs, h_out);
  }

 private:
  io::ModelConfig config_;
  std::optional<ModelWeights> weights_;
  uint64_t seed_;
  ops::WeightFormat experts_format_;
  ModelShard shard_;
  Peers peers_;
  CudaRunnerOptions runner_;
  std::unique_ptr<CudaGlm5Model> model_;
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(ModelWeights weights, Peers peers, CudaRunnerOptions runner) {
  io::ModelConfig config = weights.config;
  const ModelShard shard = weights.shard;
  return std::make_unique<CudaRunner>(std::move(config), std::move(weights), 0, ops::WeightFormat::Plain, shard, peers,
                                      runner);
}

std::unique_ptr<StepRunner> make_synthetic_cuda_runner(const io::ModelConfig& config, uint64_t seed,
                                                       ops::WeightFormat experts_format, const ModelShard& shard,
                                                       Peers peers, CudaRunnerOptions runner) {
  return std::make_unique<CudaRunner>(config, std::nullopt, seed, experts_format, shard, peers, runner);
}

}  // namespace glms::model

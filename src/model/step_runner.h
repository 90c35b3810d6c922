// A model together with its paged cache on one device, seen as the thing that runs forward
// steps: what the serving engine and plain generation need, whichever backend holds the
// weights. The CPU runner wraps Glm5Model and a host cache; the CUDA runner (cuda/model.h)
// wraps CudaGlm5Model and its device cache. Block ids in a batch index the runner's cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "kv/latent_cache.h"
#include "model/batch.h"
#include "ops/ops.h"

namespace glms::model {

class Glm5Model;
struct ForwardTrace;

// What the cache and the step workspaces are sized for.
struct CacheShape {
  int block_size = 16;
  // Cache blocks; 0: as many as the device's memory budget allows (device runners only).
  int num_blocks = 0;
  // The fraction of the device's memory the runner may hold in all (weights, workspaces, cache),
  // when num_blocks is 0 (vLLM's --gpu-memory-utilization).
  double gpu_memory_utilization = 0.9;
  int max_tokens = 2048;     // tokens per step
  int max_sequences = 64;    // sequences per step
  int max_logits = 0;        // logits rows per step; 0: max_sequences
  int max_context = 4096;    // positions per sequence
  bool mtp = false;          // also a paged cache for the MTP draft layer (same block ids)
  kv::CacheDtype cache_dtype = kv::CacheDtype::kAuto;  // what the cache rows hold
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual std::string device() const = 0;  // "cpu", "cuda"
  // Bytes one token's cache rows take on this device in a cache of `dtype` (for sizing the cache
  // by a budget), with the MTP layer's rows where `mtp` (CacheShape::mtp: the drafts' cache).
  virtual int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const = 0;
  // Allocates the paged cache and whatever a step needs; forward() needs it first.
  virtual void allocate(const CacheShape& shape) = 0;
  // The cache blocks allocate() made (what a num_blocks of 0 came to).
  virtual int num_blocks() const = 0;
  // Uses only the first `blocks` of them (a layout's ranks agree on the smallest count).
  virtual void limit_blocks(int blocks) = 0;
  // Bytes this runner's device holds for weights and for the cache (0 where not tracked).
  virtual int64_t weight_bytes() const { return 0; }
  virtual int64_t cache_bytes() const { return 0; }
  // One step: logits [batch.logits_tokens.size(), vocab] fp32. `trace` receives the last hidden
  // states (the MTP drafts need them); the CPU runner also records every layer's when asked.
  virtual std::vector<float> forward(const ForwardBatch& batch, ForwardTrace* trace) = 0;
  std::vector<float> forward(const ForwardBatch& batch) { return forward(batch, nullptr); }
  // The same step returning for each logits row what outputs[i] asks (one entry per row): its
  // argmax, its whole row, or a token drawn from it, after its token mask where it has one. The
  // CUDA runner masks, reduces and draws on the device and copies back only the rows asked for;
  // this default runs forward() and does the same on the host.
  virtual StepLogits forward_selected(const ForwardBatch& batch, const std::vector<RowOutput>& outputs,
                                      ForwardTrace* trace);

  // MTP drafting, where the model has an MTP layer and allocate() was asked for its cache (the
  // CUDA model always keeps one): Glm5Model::mtp_forward (depth 0) over that cache, addressed
  // by the batch's block ids.
  virtual bool has_mtp() const { return false; }
  virtual std::vector<float> mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out);
  // The same with forward_selected's outputs: greedy drafts need only each row's argmax. This
  // default runs mtp_forward().
  virtual StepLogits mtp_forward_selected(const ForwardBatch& batch, const float* h_prev,
                                          const std::vector<RowOutput>& outputs, std::vector<float>* h_out);
};

// A kSample row's filters as the op takes them.
ops::SamplingFilter sampling_filter(const RowOutput& output);
// forward_selected's outputs made on the host from logits [outputs.size(), vocab_size], each
// row's RowOutput::mask applied first.
StepLogits select_logits(const float* logits, int vocab_size, const std::vector<RowOutput>& outputs);

// The CPU path over `model` (which must outlive the runner).
std::unique_ptr<StepRunner> make_cpu_runner(const Glm5Model& model);
// The same owning its model (a parallel rank's).
std::unique_ptr<StepRunner> make_cpu_runner(std::shared_ptr<const Glm5Model> model);

}  // namespace glms::model

// A model together with its paged cache on one device, seen as the thing that runs forward
// steps: what the serving engine and plain generation need, whichever backend holds the
// weights. The CPU runner wraps Glm5Model and a host cache; the CUDA runner (glm5_cuda.h)
// wraps CudaGlm5Model and its device cache. Block ids in a batch index the runner's cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"

namespace glms::model {

class Glm5Model;
struct ForwardTrace;

// What the cache and the step workspaces are sized for.
struct CacheShape {
  int block_size = 16;
  int num_blocks = 0;
  int max_tokens = 2048;     // tokens per step
  int max_sequences = 64;    // sequences per step
  int max_logits = 0;        // logits rows per step; 0: max_sequences
  int max_context = 4096;    // positions per sequence
  bool mtp = false;          // also a paged cache for the MTP draft layer (same block ids)
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual std::string device() const = 0;  // "cpu", "cuda"
  // Bytes one token's cache rows take on this device (for sizing the cache by a budget).
  virtual int64_t cache_bytes_per_token() const = 0;
  // Allocates the paged cache and whatever a step needs; forward() needs it first.
  virtual void allocate(const CacheShape& shape) = 0;
  // One step: logits [batch.logits_tokens.size(), vocab] fp32. `trace` receives the last hidden
  // states (the MTP drafts need them); the CPU runner also records every layer's when asked.
  virtual std::vector<float> forward(const ForwardBatch& batch, ForwardTrace* trace) = 0;
  std::vector<float> forward(const ForwardBatch& batch) { return forward(batch, nullptr); }
  // The same step returning every logits row's argmax and the full logits of the rows with
  // want_full[i] set (one flag per logits row). The CUDA runner reduces on the device and copies
  // back only what is asked for; this default runs forward() and reduces on the host.
  virtual StepLogits forward_selected(const ForwardBatch& batch, const std::vector<uint8_t>& want_full,
                                      ForwardTrace* trace);

  // MTP drafting, where the model has an MTP layer and allocate() was asked for its cache (the
  // CUDA model always keeps one): Glm5Model::mtp_forward (depth 0) over that cache, addressed
  // by the batch's block ids.
  virtual bool has_mtp() const { return false; }
  virtual std::vector<float> mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out);
  // The same returning each logits row's argmax and only the want_full rows (forward_selected's
  // contract): greedy drafts need nothing more. This default runs mtp_forward().
  virtual StepLogits mtp_forward_selected(const ForwardBatch& batch, const float* h_prev,
                                          const std::vector<uint8_t>& want_full, std::vector<float>* h_out);
};

// Host-side forward_selected over logits [want_full.size(), vocab_size].
StepLogits select_logits(const float* logits, int vocab_size, const std::vector<uint8_t>& want_full);

// The CPU path over `model` (which must outlive the runner).
std::unique_ptr<StepRunner> make_cpu_runner(const Glm5Model& model);

}  // namespace glms::model

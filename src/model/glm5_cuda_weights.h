// GLM-5 weights in device memory for CudaGlm5Model: matrices bf16 row-major as the checkpoint
// names them, gate and up stacked into one [2 * inter, hidden] matrix per MLP (one GEMM), the
// routed experts of a layer stacked into [E, 2 * inter, hidden] and [E, hidden, inter], the
// router and every norm vector fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/weights.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::model {

struct IndexerDevice {
  ops::cuda::DeviceBuffer wq_b, wk, weights_proj;  // bf16
  ops::cuda::DeviceBuffer k_norm_weight, k_norm_bias;  // fp32 [index_head_dim]
};

struct AttentionDevice {
  ops::cuda::DeviceBuffer q_a_proj, q_b_proj, kv_a_proj, kv_b_proj, o_proj;  // bf16
  ops::cuda::DeviceBuffer q_a_norm, kv_a_norm;                               // fp32
  bool has_indexer = false;
  IndexerDevice indexer;
};

struct MlpDevice {
  int64_t inter = 0;
  ops::cuda::DeviceBuffer gate_up;  // [2 * inter, hidden] bf16: gate rows, then up rows
  ops::cuda::DeviceBuffer down;     // [hidden, inter] bf16
};

struct MoeDevice {
  ops::cuda::DeviceBuffer router;           // [E, hidden] fp32
  ops::cuda::DeviceBuffer correction_bias;  // [E] fp32
  ops::cuda::DeviceBuffer experts_gate_up;  // [E, 2 * moe_inter, hidden] bf16
  ops::cuda::DeviceBuffer experts_down;     // [E, hidden, moe_inter] bf16
  MlpDevice shared;
};

struct DecoderLayerDevice {
  ops::cuda::DeviceBuffer input_norm, post_attention_norm;  // fp32 [hidden]
  AttentionDevice attention;
  bool is_moe = false;
  MlpDevice mlp;
  MoeDevice moe;
};

struct CudaWeights {
  ops::cuda::DeviceBuffer embed_tokens;  // [vocab, hidden] bf16
  std::vector<DecoderLayerDevice> layers;
  ops::cuda::DeviceBuffer final_norm;    // fp32 [hidden]
  ops::cuda::DeviceBuffer lm_head;       // [vocab, hidden] bf16
  int64_t bytes = 0;                     // device bytes of all of the above
};

// Uploads the decoder layers and head of `weights` (any stored format, widened or dequantised
// to bf16 on the host first). Throws glms::Error for configurations the CUDA path lacks.
CudaWeights upload_weights(const ModelWeights& weights);

// Seeded random weights of `config` made on the device.
CudaWeights synthetic_weights(const io::ModelConfig& config, uint64_t seed);

// Checks what the CUDA forward pass supports (q_lora_rank > 0, default rope, a full indexer
// layer first, at most 1024 experts, latent <= 512).
void check_cuda_supported(const io::ModelConfig& config);

}  // namespace glms::model

// GLM-5 weights in device memory for CudaGlm5Model: matrices bf16 row-major as the checkpoint
// names them, gate and up stacked into one [2 * inter, hidden] matrix per MLP (one GEMM), the
// routed experts of a layer stacked into [E, 2 * inter, hidden] and [E, hidden, inter] (bf16,
// or kept in MXFP4 / block FP8 as ops/cuda/moe.h lays them out), the router and every norm
// vector fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "io/model_config.h"
#include "model/weights.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::model {

struct IndexerDevice {
  ops::cuda::DeviceBuffer wq_b, wk, weights_proj;  // bf16
  ops::cuda::DeviceBuffer k_norm_weight, k_norm_bias;  // fp32 [index_head_dim]
};

// q_b, kv_b and o_proj hold this rank's `heads` (model/shard.h); the rest is whole.
struct AttentionDevice {
  int heads = 0;
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

// The router covers the model's E experts; the stacked experts are this rank's num_experts
// (from first_expert), each expert_inter wide.
struct MoeDevice {
  ops::cuda::DeviceBuffer router;           // [E, hidden] fp32
  ops::cuda::DeviceBuffer correction_bias;  // [E] fp32
  int first_expert = 0, num_experts = 0;
  int64_t expert_inter = 0;
  ops::WeightFormat experts_format = ops::WeightFormat::Plain;
  ops::cuda::DeviceBuffer experts_gate_up;  // [E, 2 * moe_inter, hidden] (ops::cuda::ExpertWeights)
  ops::cuda::DeviceBuffer experts_down;     // [E, hidden, moe_inter]
  ops::cuda::DeviceBuffer experts_gate_up_scales, experts_down_scales;  // quantised formats only
  bool experts_mxfp4_tiled = false;  // MXFP4 rows in the tile layout: see ops::cuda::ExpertWeights
  MlpDevice shared;
};

struct DecoderLayerDevice {
  ops::cuda::DeviceBuffer input_norm, post_attention_norm;  // fp32 [hidden]
  AttentionDevice attention;
  bool is_moe = false;
  MlpDevice mlp;
  MoeDevice moe;
};

// The MTP draft layer: eh_proj split by its input halves (the enorm(embedding) columns, then the
// hnorm(hidden) ones) so that two GEMMs replace a concatenation.
struct MtpDevice {
  ops::cuda::DeviceBuffer enorm, hnorm;                   // fp32 [hidden]
  ops::cuda::DeviceBuffer eh_proj_embed, eh_proj_hidden;  // bf16 [hidden, hidden] each
  DecoderLayerDevice block;
  ops::cuda::DeviceBuffer shared_head_norm;  // fp32 [hidden]
  ops::cuda::DeviceBuffer shared_head;       // bf16 [vocab, hidden]; empty: the model's lm_head
  ops::cuda::DeviceBuffer embed_tokens;      // bf16 [vocab, hidden]; empty: the model's embedding
};

struct CudaWeights {
  ops::cuda::DeviceBuffer embed_tokens;  // [vocab, hidden] bf16
  std::vector<DecoderLayerDevice> layers;
  std::vector<MtpDevice> mtp;            // the checkpoint's MTP layers (none for synthetic weights)
  ops::cuda::DeviceBuffer final_norm;    // fp32 [hidden]
  ops::cuda::DeviceBuffer lm_head;       // [vocab, hidden] bf16
  int64_t bytes = 0;                     // device bytes of all of the above
};

// Uploads the decoder layers, head and MTP layers of `weights` (a shard's when it was loaded as
// one). Routed experts stored as MXFP4 or block FP8 stay so (when every expert matrix of the
// layer is in that format and the widths suit the kernels: multiples of 32 / 16); everything
// else is widened or dequantised to bf16 on the host, a matrix at a time.
// Throws glms::Error for configurations the CUDA path lacks.
// progress(layers done, layers, device bytes so far) after each decoder layer.
using UploadProgress = std::function<void(int, int, int64_t)>;
CudaWeights upload_weights(const ModelWeights& weights, const UploadProgress& progress = {});

// Seeded random weights of `config` made on the device; routed experts in `experts_format`
// (Plain: bf16; Mxfp4: random E2M1 codes with one E8M0 scale per layer matrix; Fp8Block:
// uniform E4M3 codes and a constant block scale), every matrix of standard deviation about
// 1/sqrt(fan_in).
// With `with_mtp`, also an MTP layer of random weights (a MoE block with its own indexer).
// `shard`'s part only, in its shapes: every rank of a layout draws the same values for what
// they all hold (replicated tensors come out identical).
CudaWeights synthetic_weights(const io::ModelConfig& config, uint64_t seed,
                              ops::WeightFormat experts_format = ops::WeightFormat::Plain, bool with_mtp = false,
                              const ModelShard& shard = {});

// Checks what the CUDA forward pass supports (q_lora_rank > 0, default rope, a full indexer
// layer first, at most 1024 experts, latent <= 512).
void check_cuda_supported(const io::ModelConfig& config);

}  // namespace glms::model

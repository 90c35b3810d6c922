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

// A linear layer's matrix [rows, cols]: bf16, or block FP8 (E4M3 codes [rows, cols] and fp32
// 128 x 128 block scales in ops::cuda::fp8_weight_scales_for_cublaslt's layout) where the model
// keeps FP8 weights (CudaLinearWeights; rows a multiple of 16, cols of 128).
struct LinearDevice {
  ops::WeightFormat format = ops::WeightFormat::Plain;
  int64_t rows = 0, cols = 0;
  ops::cuda::DeviceBuffer w;       // bf16 values or E4M3 codes
  ops::cuda::DeviceBuffer scales;  // FP8 only
  bool fp8() const { return format == ops::WeightFormat::Fp8Block; }
};

// Which linear layers (q_a, q_b, kv_a, o_proj, dense MLPs, shared experts) the device keeps in
// block FP8: those the checkpoint stores so (vLLM serves an FP8 checkpoint in FP8), all of them
// (quantised at upload: --quantization fp8), or none (widened to bf16). Matrices whose widths do
// not suit the FP8 kernels (rows a multiple of 16, cols of 128) stay bf16 either way; kv_b, the
// indexer, embeddings, lm_head and the MTP projections always do.
enum class CudaLinearWeights { kAsStored, kFp8, kBf16 };

struct IndexerDevice {
  ops::cuda::DeviceBuffer wq_b, wk, weights_proj;  // bf16
  ops::cuda::DeviceBuffer k_norm_weight, k_norm_bias;  // fp32 [index_head_dim]
};

// q_b, kv_b and o_proj hold this rank's `heads` (model/shard.h); the rest is whole.
struct AttentionDevice {
  int heads = 0;
  LinearDevice q_a_proj, q_b_proj, kv_a_proj, o_proj;
  ops::cuda::DeviceBuffer kv_b_proj;  // bf16 (absorbed per head)
  ops::cuda::DeviceBuffer q_a_norm, kv_a_norm;                               // fp32
  bool has_indexer = false;
  IndexerDevice indexer;
};

struct MlpDevice {
  int64_t inter = 0;
  LinearDevice gate_up;  // [2 * inter, hidden]: gate rows, then up rows
  LinearDevice down;     // [hidden, inter]
};

// The router covers the model's E experts; the stacked experts are this rank's num_experts
// (from first_expert), each expert_inter wide.
struct MoeDevice {
  ops::cuda::DeviceBuffer router;           // [E, hidden] fp32
  // The same values in bf16 where every one is a bf16 value (published checkpoints keep the
  // router in bf16), else empty: prefill scores them on the tensor cores (Gemm::linear_f32_terms).
  ops::cuda::DeviceBuffer router_bf16;
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
  int linear_matrices = 0, fp8_linear_matrices = 0;  // of the LinearDevice ones, how many are FP8
  int64_t fp8_linear_parameters = 0;                  // values of the FP8 ones
};

// Uploads the decoder layers, head and MTP layers of `weights` (a shard's when it was loaded as
// one). Routed experts stored as MXFP4 or block FP8 stay so (when every expert matrix of the
// layer is in that format and the widths suit the kernels: multiples of 32 / 16); everything
// else is widened or dequantised to bf16 on the host, a matrix at a time.
// Throws glms::Error for configurations the CUDA path lacks.
// progress(layers done, layers, device bytes so far) after each decoder layer.
using UploadProgress = std::function<void(int, int, int64_t)>;
CudaWeights upload_weights(const ModelWeights& weights, const UploadProgress& progress = {},
                           CudaLinearWeights linears = CudaLinearWeights::kAsStored);

// Seeded random weights of `config` made on the device; routed experts in `experts_format`
// (Plain: bf16; Mxfp4: random E2M1 codes with one E8M0 scale per layer matrix; Fp8Block:
// uniform E4M3 codes and a constant block scale), every matrix of standard deviation about
// 1/sqrt(fan_in).
// With `with_mtp`, also an MTP layer of random weights (a MoE block with its own indexer).
// `shard`'s part only, in its shapes: every rank of a layout draws the same values for what
// they all hold (replicated tensors come out identical).
// With `fp8_linears`, the linear layers that suit it in block FP8 (uniform E4M3 codes, a
// constant block scale).
CudaWeights synthetic_weights(const io::ModelConfig& config, uint64_t seed,
                              ops::WeightFormat experts_format = ops::WeightFormat::Plain, bool with_mtp = false,
                              const ModelShard& shard = {}, bool fp8_linears = false);

// Whether a [rows, cols] linear layer can be kept in block FP8 on the device.
inline bool fp8_linear_fits(int64_t rows, int64_t cols) { return rows % 16 == 0 && cols % 128 == 0; }

// Checks what the CUDA forward pass supports (q_lora_rank > 0, default rope, a full indexer
// layer first, at most 1024 experts, latent <= 512).
void check_cuda_supported(const io::ModelConfig& config);

}  // namespace glms::model

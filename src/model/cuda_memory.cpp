#include "model/cuda_memory.h"

#include "quant/kv_fp8.h"
#include "quant/mxfp4_tiles.h"

namespace glms::model {

CudaRankWidths cuda_rank_widths(const io::ModelConfig& c, const ModelShard& shard, bool quantised_experts, bool mtp,
                                bool fp8_linears, bool mxfp4_experts) {
  CudaRankWidths w;
  w.heads = shard.heads(c);
  const auto& moe = c.layer_is_moe;
  const bool has_dense = std::find(moe.begin(), moe.end(), false) != moe.end();
  // The MTP block is a MoE layer.
  const bool has_moe = std::find(moe.begin(), moe.end(), true) != moe.end() || (mtp && c.num_nextn_predict_layers > 0);
  const int64_t dense_inter = has_dense ? shard.mlp_width(c.intermediate_size) : 0;
  const int64_t shared_inter = has_moe ? shard.mlp_width(int64_t{c.moe_intermediate_size} * c.n_shared_experts) : 0;
  w.mlp_inter = std::max(dense_inter, shared_inter);
  if (has_moe) {
    w.local_experts = shard.experts(c);
    w.expert_inter = shard.expert_width(c);
    w.quantised_experts = quantised_experts;
    w.tiled_mxfp4_experts =
        mxfp4_experts && quant::mxfp4_tiles_fit(c.hidden_size) && quant::mxfp4_tiles_fit(w.expert_inter);
  }
  w.dp_ranks = shard.dp_size;
  w.mtp_indexer = mtp && c.num_nextn_predict_layers > 0 && c.index_head_dim > 0;
  if (fp8_linears) {
    // The inputs of q_a, kv_a (hidden), q_b (q_lora), o_proj (the rank's heads' values) and the
    // MLPs' down projections, where [rows, cols] suits block FP8 (model/cuda/weights.h).
    auto consider = [&](int64_t rows, int64_t cols) {
      if (rows % 16 == 0 && cols % 128 == 0) w.fp8_linear_cols = std::max(w.fp8_linear_cols, cols);
    };
    const int64_t hidden = c.hidden_size;
    consider(c.q_lora_rank, hidden);
    consider(c.kv_lora_rank + c.qk_rope_head_dim, hidden);
    consider(w.heads * c.qk_head_dim(), c.q_lora_rank);
    consider(hidden, w.heads * c.v_head_dim);
    for (int64_t inter : {dense_inter, shared_inter})
      if (inter > 0) {
        consider(2 * inter, hidden);
        consider(hidden, inter);
      }
  }
  return w;
}

int64_t cuda_workspace_bytes(const io::ModelConfig& config, const CudaRankWidths& widths,
                             const CudaStepLimits& limits) {
  int64_t total = 0;
  CudaWorkspaces<int64_t> sizes;
  make_cuda_workspaces(sizes, config, widths, limits, [&](int64_t bytes) {
    total += cuda_allocation_bytes(bytes);
    return bytes;
  });
  return total;
}

int64_t cuda_cache_row_bytes(const io::ModelConfig& c, kv::CacheDtype dtype) {
  return dtype == kv::CacheDtype::kFp8E4m3 ? quant::kv_fp8_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim)
                                           : int64_t{sizeof(uint16_t)} * (c.kv_lora_rank + c.qk_rope_head_dim);
}

int64_t cuda_cache_key_bytes(const io::ModelConfig& c, kv::CacheDtype dtype) {
  return dtype == kv::CacheDtype::kFp8E4m3 ? c.index_head_dim + int64_t{sizeof(float)}
                                           : int64_t{sizeof(uint16_t)} * c.index_head_dim;
}

int64_t cuda_cache_bytes_per_token(const io::ModelConfig& c, kv::CacheDtype dtype, bool mtp, bool mtp_indexer) {
  const int64_t row = cuda_cache_row_bytes(c, dtype), keys = cuda_cache_key_bytes(c, dtype);
  int64_t bytes = row * c.num_hidden_layers + keys * c.num_full_indexer_layers();
  if (mtp) bytes += row + (mtp_indexer ? keys : 0);
  return bytes;
}

int64_t cuda_cache_blocks_that_fit(int64_t free_bytes, int64_t bytes_per_token, int block_size) {
  if (free_bytes <= 0 || bytes_per_token <= 0 || block_size <= 0) return 0;
  return std::max<int64_t>(0, free_bytes / (bytes_per_token * block_size) - 1);
}

}  // namespace glms::model

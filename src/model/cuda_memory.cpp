#include "model/cuda_memory.h"

namespace glms::model {

CudaRankWidths cuda_rank_widths(const io::ModelConfig& c, const ModelShard& shard, bool quantised_experts, bool mtp) {
  CudaRankWidths w;
  w.heads = shard.heads(c);
  const auto& moe = c.layer_is_moe;
  const bool has_dense = std::find(moe.begin(), moe.end(), false) != moe.end();
  // The MTP block is a MoE layer.
  const bool has_moe = std::find(moe.begin(), moe.end(), true) != moe.end() || (mtp && c.num_nextn_predict_layers > 0);
  if (has_dense) w.mlp_inter = shard.mlp_width(c.intermediate_size);
  if (has_moe) {
    w.mlp_inter = std::max(w.mlp_inter, shard.mlp_width(int64_t{c.moe_intermediate_size} * c.n_shared_experts));
    w.local_experts = shard.experts(c);
    w.expert_inter = shard.expert_width(c);
    w.quantised_experts = quantised_experts;
  }
  w.dp_ranks = shard.dp_size;
  w.mtp_indexer = mtp && c.num_nextn_predict_layers > 0 && c.index_head_dim > 0;
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

int64_t cuda_cache_bytes_per_token(const io::ModelConfig& c, bool mtp, bool mtp_indexer) {
  const int64_t row = int64_t{sizeof(uint16_t)} * (c.kv_lora_rank + c.qk_rope_head_dim);
  const int64_t keys = int64_t{sizeof(float)} * c.index_head_dim;
  int64_t bytes = row * c.num_hidden_layers + keys * c.num_full_indexer_layers();
  if (mtp) bytes += row + (mtp_indexer ? keys : 0);
  return bytes;
}

int64_t cuda_cache_blocks_that_fit(int64_t free_bytes, int64_t bytes_per_token, int block_size) {
  if (free_bytes <= 0 || bytes_per_token <= 0 || block_size <= 0) return 0;
  return std::max<int64_t>(0, free_bytes / (bytes_per_token * block_size) - 1);
}

}  // namespace glms::model

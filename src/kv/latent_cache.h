// Paged cache of what MLA attention and the DSA indexer need per token: the normalised
// latent (kv_lora_rank) + the rotated shared rope key (qk_rope_head_dim) on every layer, and
// the indexer key (index_head_dim) on layers that run their own indexer. Storage is split into
// fixed-size blocks; a sequence's block table maps its logical blocks to physical ones, and a
// token's slot is block_id * block_size + offset.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace glms::kv {

// What the cache's rows hold. kAuto: the runner's own precision (fp32 on the CPU, bf16 on
// CUDA). kFp8E4m3 (vLLM's --kv-cache-dtype fp8 / fp8_e4m3): the values an FP8 cache gives back
// (quant/kv_fp8.h: the latent in E4M3 with a scale per 128 values, the rope key in bf16, the
// indexer key in E4M3 with one scale), which the CPU cache keeps in fp32 storage as the
// reference for a device layout.
enum class CacheDtype : uint8_t { kAuto, kFp8E4m3 };
// "auto"; "fp8", "fp8_e4m3" and "fp8_ds_mla" (DeepSeek-V3.2's layout, which kFp8E4m3 follows);
// anything else fails naming the accepted values.
CacheDtype parse_cache_dtype(const std::string& text);
const char* cache_dtype_name(CacheDtype dtype);  // "auto", "fp8_e4m3"

struct CacheLayout {
  int num_layers = 0;
  int latent_dim = 0;              // kv_lora_rank
  int rope_dim = 0;                // qk_rope_head_dim
  int index_dim = 0;               // index_head_dim
  std::vector<bool> layer_has_index_keys;  // [num_layers]
  int block_size = 64;
  CacheDtype dtype = CacheDtype::kAuto;

  int latent_row_size() const { return latent_dim + rope_dim; }
  // Bytes per token over all layers at fp32 (what the CPU cache stores).
  int64_t bytes_per_token() const;
};

class PagedLatentCache {
 public:
  PagedLatentCache(CacheLayout layout, int num_blocks);

  const CacheLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return layout_.block_size; }

  // [latent_dim + rope_dim] fp32 row of `slot` on `layer`: latent first, then the rope key.
  float* latent_row(int layer, int64_t slot) { return latent_[layer].data() + slot * layout_.latent_row_size(); }
  const float* latent_row(int layer, int64_t slot) const {
    return latent_[layer].data() + slot * layout_.latent_row_size();
  }
  // [index_dim] fp32 indexer key of `slot` on a layer that has index keys.
  float* index_key_row(int layer, int64_t slot) { return index_keys_[layer].data() + slot * layout_.index_dim; }
  const float* index_key_row(int layer, int64_t slot) const {
    return index_keys_[layer].data() + slot * layout_.index_dim;
  }

 private:
  CacheLayout layout_;
  int num_blocks_;
  std::vector<std::vector<float>> latent_;      // per layer [num_blocks * block_size, latent + rope]
  std::vector<std::vector<float>> index_keys_;  // per layer [num_blocks * block_size, index_dim] or empty
};

// Free list of physical blocks with reference counts (shared prefix blocks have count > 1).
class BlockPool {
 public:
  explicit BlockPool(int num_blocks);
  std::optional<int> allocate();   // count 1; nullopt when none is free
  void retain(int block);          // count + 1
  void release(int block);         // count - 1; returns the block to the free list at 0
  int ref_count(int block) const { return ref_counts_[block]; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }

 private:
  std::vector<int> free_;
  std::vector<int> ref_counts_;
};

}  // namespace glms::kv

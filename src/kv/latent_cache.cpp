#include "kv/latent_cache.h"

#include "core/error.h"

namespace glms::kv {

CacheDtype parse_cache_dtype(const std::string& text) {
  if (text == "auto") return CacheDtype::kAuto;
  if (text == "fp8" || text == "fp8_e4m3" || text == "fp8_ds_mla") return CacheDtype::kFp8E4m3;
  fail("--kv-cache-dtype " + text + " is not supported: auto (the runner's precision) or fp8 / fp8_e4m3 (E4M3 rows "
       "with a scale per 128 values)");
}

const char* cache_dtype_name(CacheDtype dtype) { return dtype == CacheDtype::kFp8E4m3 ? "fp8_e4m3" : "auto"; }

int64_t CacheLayout::bytes_per_token() const {
  int64_t floats = 0;
  for (int layer = 0; layer < num_layers; ++layer)
    floats += latent_row_size() + (layer_has_index_keys[layer] ? index_dim : 0);
  return floats * static_cast<int64_t>(sizeof(float));
}

PagedLatentCache::PagedLatentCache(CacheLayout layout, int num_blocks)
    : layout_(std::move(layout)), num_blocks_(num_blocks) {
  GLMS_CHECK(static_cast<int>(layout_.layer_has_index_keys.size()) == layout_.num_layers,
             "layer_has_index_keys must have one entry per layer");
  const int64_t slots = static_cast<int64_t>(num_blocks) * layout_.block_size;
  latent_.resize(layout_.num_layers);
  index_keys_.resize(layout_.num_layers);
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    latent_[layer].assign(static_cast<size_t>(slots * layout_.latent_row_size()), 0.0f);
    if (layout_.layer_has_index_keys[layer])
      index_keys_[layer].assign(static_cast<size_t>(slots * layout_.index_dim), 0.0f);
  }
}

BlockPool::BlockPool(int num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int block = num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

std::optional<int> BlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int block = free_.back();
  free_.pop_back();
  ref_counts_[block] = 1;
  return block;
}

void BlockPool::retain(int block) {
  GLMS_CHECK(ref_counts_[block] > 0, "retain of a free block");
  ++ref_counts_[block];
}

void BlockPool::release(int block) {
  GLMS_CHECK(ref_counts_[block] > 0, "release of a free block");
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

}  // namespace glms::kv

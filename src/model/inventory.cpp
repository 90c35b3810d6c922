#include "model/inventory.h"

#include <cmath>

#include "core/error.h"

namespace glms::model {

namespace {

struct LayerCounts {
  int64_t attention = 0, indexer = 0, norms = 0, dense_mlp = 0, routed = 0, shared = 0, router = 0;
};

LayerCounts layer_counts(const io::ModelConfig& c, bool indexer_full, bool is_moe) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  LayerCounts n;
  n.attention = h * c.q_lora_rank + int64_t{c.q_lora_rank} * heads * c.qk_head_dim() +
                h * (c.kv_lora_rank + c.qk_rope_head_dim) +
                int64_t{c.kv_lora_rank} * heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.v_head_dim * h;
  n.norms = 2 * h + c.q_lora_rank + c.kv_lora_rank;
  if (indexer_full)
    n.indexer = int64_t{c.q_lora_rank} * c.index_n_heads * c.index_head_dim + h * c.index_head_dim +
                h * c.index_n_heads + 2 * c.index_head_dim;
  if (is_moe) {
    n.routed = int64_t{c.n_routed_experts} * 3 * h * c.moe_intermediate_size;
    n.shared = 3 * h * int64_t{c.moe_intermediate_size} * c.n_shared_experts;
    n.router = int64_t{c.n_routed_experts} * h + c.n_routed_experts;
  } else {
    n.dense_mlp = 3 * h * int64_t{c.intermediate_size};
  }
  return n;
}

}  // namespace

int64_t Inventory::total() const {
  int64_t sum = 0;
  for (const auto& g : groups) sum += g.parameters;
  return sum;
}

int64_t Inventory::active_per_token(const io::ModelConfig& c) const {
  int64_t sum = 0;
  for (const auto& g : groups) {
    if (g.in_mtp) continue;
    if (g.name == "routed_experts")
      sum += g.parameters / c.n_routed_experts * c.num_experts_per_tok;
    else if (g.name != "embed_tokens")
      sum += g.parameters;
  }
  return sum;
}

int64_t Inventory::weight_bytes(const std::string& format) const {
  double bytes = 0.0;
  for (const auto& g : groups) {
    const double n = static_cast<double>(g.parameters);
    // Norms, router, embeddings and lm_head stay bf16 in every published format; the MX
    // checkpoints (AMD Quark) also exclude the MTP layer, the FP8 ones quantise it.
    const bool mx = format == "mxfp4" || format == "mxfp6";
    const bool keep_bf16 = !g.is_matrix || (g.in_mtp && mx) || g.name == "embed_tokens" || g.name == "lm_head";
    if (format == "bf16" || keep_bf16) bytes += 2.0 * n;
    else if (format == "fp8") bytes += n * (1.0 + 4.0 / (128.0 * 128.0));
    else if (format == "mxfp6") bytes += g.quantizable_fp4 ? n * 6.25 / 8.0 : 2.0 * n;
    else if (format == "mxfp4") bytes += g.quantizable_fp4 ? n * 4.25 / 8.0 : 2.0 * n;
    else fail("unknown weight format '" + format + "' (bf16, fp8, mxfp6, mxfp4)");
  }
  return static_cast<int64_t>(std::llround(bytes));
}

Inventory parameter_inventory(const io::ModelConfig& c) {
  LayerCounts sum, mtp;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerCounts n = layer_counts(c, c.indexer_full[l], c.layer_is_moe[l]);
    sum.attention += n.attention; sum.indexer += n.indexer; sum.norms += n.norms; sum.dense_mlp += n.dense_mlp;
    sum.routed += n.routed; sum.shared += n.shared; sum.router += n.router;
  }
  const int64_t h = c.hidden_size;
  Inventory inv;
  inv.groups.push_back({"embed_tokens", int64_t{c.vocab_size} * h, true, false, false});
  inv.groups.push_back({"attention", sum.attention, true, false, false});
  inv.groups.push_back({"indexer", sum.indexer, true, false, false});
  inv.groups.push_back({"dense_mlp", sum.dense_mlp, true, true, false});
  inv.groups.push_back({"routed_experts", sum.routed, true, true, false});
  inv.groups.push_back({"shared_experts", sum.shared, true, true, false});
  inv.groups.push_back({"router", sum.router, false, false, false});
  inv.groups.push_back({"norms", sum.norms + h, false, false, false});
  if (!c.tie_word_embeddings) inv.groups.push_back({"lm_head", int64_t{c.vocab_size} * h, true, false, false});
  if (c.num_nextn_predict_layers > 0) {
    // enorm, hnorm, eh_proj, one MoE decoder block with its indexer, shared_head.norm
    // (shared_head.head is stored too in the real checkpoints).
    const LayerCounts n = layer_counts(c, true, true);
    const int64_t per_layer = 3 * h + 2 * h * h + n.attention + n.indexer + n.norms + n.routed + n.shared +
                              n.router + int64_t{c.vocab_size} * h;
    inv.groups.push_back({"mtp", per_layer * c.num_nextn_predict_layers, true, false, true});
  }
  return inv;
}

}  // namespace glms::model

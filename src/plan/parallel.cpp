#include "plan/parallel.h"

#include <algorithm>

#include "plan/roofline.h"

namespace glms::plan {

namespace {

// The part of the "attention" group a tensor-parallel rank splits (q_b, kv_b, o_proj), by
// parameters; q_a and kv_a are whole on every rank.
double split_attention_fraction(const ModelSpec& m) {
  const double whole = static_cast<double>(m.group_bytes("attention", "bf16")) / 2.0;
  if (whole <= 0) return 1.0;
  const double replicated = double(m.layers) * m.hidden * (double(m.q_lora_rank) + m.kv_lora_rank + m.qk_rope_head_dim);
  return std::max(0.0, (whole - replicated) / whole);
}

// Bytes of the non-expert groups one rank holds (MTP excluded).
double rank_shared_bytes(const ModelSpec& m, const std::string& format, const RankShape& r) {
  const double split = split_attention_fraction(m);
  double bytes = 0;
  for (const auto& g : m.inventory.groups) {
    if (g.in_mtp || g.name == "routed_experts") continue;
    double b = static_cast<double>(m.group_bytes(g.name, format));
    if (g.name == "attention") b = b * (1.0 - split) + b * split / r.tp;
    else if (g.name == "dense_mlp" || g.name == "shared_experts") b /= r.tp;
    bytes += b;
  }
  return bytes;
}

}  // namespace

double rank_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r) {
  return rank_shared_bytes(m, format, r) + static_cast<double>(m.group_bytes("routed_experts", format)) / r.world();
}

double rank_decode_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r,
                                double tokens_per_rank) {
  double bytes = rank_shared_bytes(m, format, r);
  if (!m.tie_word_embeddings) bytes -= static_cast<double>(m.group_bytes("embed_tokens", format));  // rows only
  if (m.moe_layers > 0)
    bytes += m.moe_layers *
             expected_distinct_experts(m.n_routed_experts, m.experts_per_token, tokens_per_rank * r.dp) *
             m.expert_bytes(format) / r.world();
  return bytes;
}

double StepCollectives::time_s(double link_bandwidth, double latency_s) const {
  return count * latency_s + (link_bandwidth > 0 ? bytes_sent / link_bandwidth : 0.0);
}

StepCollectives step_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank) {
  StepCollectives c;
  if (r.tp > 1) {
    const double message = tokens_per_rank * m.hidden * 4.0;  // fp32 block outputs
    c.bytes_sent += 2.0 * m.layers * 2.0 * (r.tp - 1) / r.tp * message;
    c.count += 2 * m.layers;
  }
  if (r.dp > 1 && m.moe_layers > 0) {
    const double gather = tokens_per_rank * (m.hidden * 2.0 + m.experts_per_token * 8.0);
    const double scatter = tokens_per_rank * m.hidden * 4.0;
    c.bytes_sent += m.moe_layers * (r.dp - 1) * (gather + scatter);
    c.count += 2 * m.moe_layers;  // the three gathers go out as one group call
  }
  return c;
}

}  // namespace glms::plan

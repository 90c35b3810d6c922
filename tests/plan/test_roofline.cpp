// The planner's formulas on hand-computed cases (a tiny GQA model, small MoE numbers).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "plan/roofline.h"

using namespace glms;
using namespace glms::plan;

namespace {

// hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocab 100, untied.
const char* kTinyGqa = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100})";

}  // namespace

TEST(Formulas, ExpectedDistinctExperts) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 8, 1), 8.0);  // one token: its top-k
  // E=4, k=2, B=2: 4 * (1 - (1/2)^2) = 3
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 2), 3.0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 8, 0), 0.0);
  // 64 tokens over 256 experts top-8: 256 * (1 - (31/32)^64) = 222.44
  EXPECT_NEAR(expected_distinct_experts(256, 8, 64), 256 * (1 - std::pow(31.0 / 32.0, 64)), 1e-9);
  EXPECT_NEAR(expected_distinct_experts(256, 8, 64), 222.44, 0.01);
  EXPECT_NEAR(expected_distinct_experts(256, 8, 4096), 256.0, 1e-6);
}

TEST(Formulas, TinyGqaParametersAndKv) {
  const ModelSpec m = parse_model_spec(kTinyGqa, "tiny");
  // embed 6400 + attention 2*(2*64*64 + 2*64*32) = 24576 + MLP 2*3*64*128 = 49152
  // + norms 2*2*64 + 64 = 320 + lm_head 6400
  EXPECT_EQ(m.total_parameters(), 86848);
  EXPECT_EQ(m.active_parameters, 86848 - 6400);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.weight_bytes("bf16"), 2 * 86848);
  // fp8: every matrix but embeddings and lm_head at 1 + 4/128^2 bytes, the rest bf16
  const double fp8 = (24576 + 49152) * (1 + 4.0 / 16384) + 2.0 * (320 + 6400 + 6400);
  EXPECT_EQ(m.weight_bytes("fp8"), std::llround(fp8));
  // mxfp4 on every decoder linear layer of a dense model: 4.25 bits
  EXPECT_EQ(m.weight_bytes("mxfp4"), std::llround((24576 + 49152) * 4.25 / 8 + 2.0 * (320 + 6400 + 6400)));
  // K and V: 2 * 2 heads * 16 dims * 2 layers * 2 bytes
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 256.0);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, kv_dtype_bytes("fp8")), 128.0);
  EXPECT_DOUBLE_EQ(kv_bytes_read_per_step(m, 100, 2), 25600.0);
  EXPECT_THROW(kv_dtype_bytes("fp4"), Error);
}

TEST(Formulas, TinyGqaDecodeRoofline) {
  const ModelSpec m = parse_model_spec(kTinyGqa, "tiny");
  // 4 sequences at position 100, one GPU of 1 GB/s and 1 GFLOP/s.
  const DecodeBound d = decode_bound(m, "bf16", 2, 100, 4, 1, 1e9, 1e9);
  EXPECT_DOUBLE_EQ(d.weight_bytes, 2.0 * 80448);             // all but the embedding table
  EXPECT_DOUBLE_EQ(d.kv_bytes, 4 * 100 * 256.0);
  EXPECT_NEAR(d.bandwidth_time_s, (160896 + 102400) / 1e9, 1e-15);
  // per token 2 * 80448 + 4 * heads 4 * head_dim 16 * 100 positions * 2 layers = 212096
  EXPECT_DOUBLE_EQ(d.flops, 4 * 212096.0);
  EXPECT_TRUE(d.compute_bound);
  EXPECT_NEAR(d.tokens_per_s, 4 / (4 * 212096e-9), 1e-6);
  EXPECT_NEAR(d.tokens_per_s_per_sequence, 1 / (4 * 212096e-9), 1e-6);
  // Two GPUs halve both times.
  const DecodeBound d2 = decode_bound(m, "bf16", 2, 100, 4, 2, 1e9, 1e9);
  EXPECT_NEAR(d2.tokens_per_s, 2 * d.tokens_per_s, 1e-6);
  // Faster compute: memory bound.
  const DecodeBound d3 = decode_bound(m, "bf16", 2, 100, 4, 1, 1e9, 1e12);
  EXPECT_FALSE(d3.compute_bound);
  EXPECT_NEAR(d3.tokens_per_s, 4 / ((160896 + 102400) / 1e9), 1e-6);
}

TEST(Formulas, AllReduceAndCost) {
  const ModelSpec m = parse_model_spec(kTinyGqa, "tiny");
  EXPECT_DOUBLE_EQ(allreduce_bytes_per_token(m, 1), 0.0);
  // 2 all-reduces * 2 layers * 64 values * 2 bytes * 2 * (2-1)/2
  EXPECT_DOUBLE_EQ(allreduce_bytes_per_token(m, 2), 512.0);
  EXPECT_DOUBLE_EQ(allreduce_bytes_per_token(m, 8), 2 * 2 * 64 * 2 * 2 * 7 / 8.0);
  // The write-up's node: 8 GPUs at $3.41 = $27.28/hour; 2626 tok/s -> $2.886 per million.
  EXPECT_NEAR(usd_per_million_tokens(27.28, 2626, 1.0), 27.28 / (2626 * 3600.0) * 1e6, 1e-12);
  EXPECT_NEAR(usd_per_million_tokens(27.28, 2626, 1.0), 2.886, 0.001);
  EXPECT_NEAR(usd_per_million_tokens(27.28, 2626, 0.5), 2 * 2.886, 0.002);
  EXPECT_TRUE(std::isinf(usd_per_million_tokens(1, 0, 1)));
  // 1000 tok/s on 8 x 1400 W = 11.2 kW -> 89,286 tok/s per MW
  EXPECT_NEAR(tokens_per_s_per_megawatt(1000, 8 * 1400), 1000 / 0.0112, 1e-6);
}

TEST(Formulas, MixedWorkloadOutputRate) {
  // The agentic mix (20k in, 60% cached, 1k out) on a GPU decoding 1000 tok/s and prefilling
  // 4000: a request is 1000 / 1000 + 8000 / 4000 = 3 s of the GPU, 333.3 output tok/s.
  EXPECT_NEAR(mixed_output_tokens_per_s(1000, 4000, 20000, 1000, 0.6), 1000.0 / 3.0, 1e-9);
  // Nothing to prefill: the decode rate; everything cached but the output likewise.
  EXPECT_DOUBLE_EQ(mixed_output_tokens_per_s(1000, 4000, 20000, 1000, 1.0), 1000.0);
  EXPECT_DOUBLE_EQ(mixed_output_tokens_per_s(1000, 0, 0, 1000, 0.0), 1000.0);
  // Halving the prefill rate costs what its share was: 1 + 4 = 5 s a request.
  EXPECT_NEAR(mixed_output_tokens_per_s(1000, 2000, 20000, 1000, 0.6), 200.0, 1e-9);
  // No rate to serve with: 0, not a division by zero.
  EXPECT_DOUBLE_EQ(mixed_output_tokens_per_s(0, 4000, 20000, 1000, 0.6), 0.0);
  EXPECT_DOUBLE_EQ(mixed_output_tokens_per_s(1000, 0, 20000, 1000, 0.6), 0.0);
}

TEST(Formulas, DsaCapsAttendedTokens) {
  ModelSpec m;
  m.attention = AttentionKind::kMlaDsa;
  m.index_topk = 2048;
  m.layers = 2;
  m.heads = 4;
  m.kv_lora_rank = 512;
  m.qk_rope_head_dim = 64;
  m.qk_nope_head_dim = 192;
  m.v_head_dim = 256;
  m.index_n_heads = 32;
  m.index_head_dim = 128;
  m.full_indexer_layers = 1;
  EXPECT_DOUBLE_EQ(attended_tokens(m, 1000), 1000);
  EXPECT_DOUBLE_EQ(attended_tokens(m, 100000), 2048);
  EXPECT_DOUBLE_EQ(mean_attended_tokens(m, 1000), 500.5);
  // (2048 * 2049 / 2 + (4096 - 2048) * 2048) / 4096
  EXPECT_DOUBLE_EQ(mean_attended_tokens(m, 4096), 1536.25);
  // KV stored: (512 + 64) * 2 layers * 2 B + 128 * 1 full layer * 2 B (bf16 indexer keys)
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 2304 + 256);
  // read at 10000: top-2048 latent entries + all 10000 indexer keys
  EXPECT_DOUBLE_EQ(kv_bytes_read_per_step(m, 10000, 2), 2048 * 2304.0 + 10000 * 256.0);
  // decode (absorbed): 2 * 4 heads * (2*512 + 64) per attended token per layer + indexer 2*32*128 per scored
  EXPECT_DOUBLE_EQ(attention_flops(m, 2048, 10000, false), 2.0 * 4 * 1088 * 2048 * 2 + 2.0 * 32 * 128 * 10000);
  // prefill (expanded): 2 * 4 heads * (192 + 64 + 256)
  EXPECT_DOUBLE_EQ(attention_flops(m, 100, 0, true), 2.0 * 4 * 512 * 100 * 2);
  m.attention = AttentionKind::kMla;  // DeepSeek: no cap, no indexer
  EXPECT_DOUBLE_EQ(attended_tokens(m, 100000), 100000);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 2304);
}

TEST(Catalogue, Mi355xRowAndMeasuredH200) {
  const GpuSpec& mi = find_gpu("MI355X");
  EXPECT_DOUBLE_EQ(mi.memory_bytes, 288e9);
  EXPECT_DOUBLE_EQ(mi.bandwidth, 8e12);
  EXPECT_DOUBLE_EQ(mi.fp8_flops, 5.0e15);
  EXPECT_DOUBLE_EQ(mi.bf16_flops, 2.5e15);
  EXPECT_DOUBLE_EQ(mi.fp4_flops, 10.1e15);
  EXPECT_DOUBLE_EQ(mi.power_watts, 1400);
  EXPECT_DOUBLE_EQ(mi.usd_per_gpu_hour, 3.41);
  EXPECT_EQ(effective_gemm_rate(mi, "mxfp4").precision, "fp4");
  EXPECT_EQ(effective_bandwidth(mi).source, "datasheet");

  const GpuSpec& h200 = find_gpu("h200");
  EXPECT_DOUBLE_EQ(h200.memory_bytes, 143155.0 * 1024 * 1024);  // what cudaMemGetInfo reports
  const Rate bw = effective_bandwidth(h200);
  EXPECT_DOUBLE_EQ(bw.value, 4.24e12);
  EXPECT_EQ(bw.source, "measured");
  EXPECT_DOUBLE_EQ(effective_gemm_rate(h200, "bf16").value, 778e12);
  const Rate fp4 = effective_gemm_rate(h200, "mxfp4");  // no FP4 units: W4A8 at the FP8 rate
  EXPECT_DOUBLE_EQ(fp4.value, 1417e12);
  EXPECT_EQ(fp4.precision, "fp8");
  EXPECT_EQ(fp4.source, "measured");
  EXPECT_EQ(effective_gemm_rate(find_gpu("h100"), "fp8").source, "datasheet");
  for (const char* name : {"mi355x", "mi300x", "b300", "b200", "h200", "h100"}) {
    const GpuSpec& g = find_gpu(name);
    EXPECT_GT(g.memory_bytes, 0) << name;
    EXPECT_GT(g.bandwidth, 0) << name;
    EXPECT_GT(g.fp8_flops, g.bf16_flops) << name;
    EXPECT_GT(g.power_watts, 0) << name;
    EXPECT_GT(g.usd_per_gpu_hour, 0) << name;
  }
  EXPECT_THROW(find_gpu("a100"), Error);
  EXPECT_THROW(effective_gemm_rate(mi, "int4"), Error);
}

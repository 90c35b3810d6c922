// The write-ups' capacity arithmetic, reproduced from config files: 405B dense weights per
// format, 70B GQA KV cache, DeepSeek-V3 in FP8 on one 8 x 288 GB server, GLM-5.2 in MXFP4.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "plan/roofline.h"

using namespace glms;
using namespace glms::plan;

namespace {

std::string config(const std::string& name) { return std::string(GLMS_SOURCE_DIR) + "/tests/plan/configs/" + name; }
std::string glm52() { return std::string(GLMS_SOURCE_DIR) + "/models/configs/glm-5.2.json"; }

PlanInputs inputs(const std::string& gpu, int gpus, const std::string& weights, int64_t context, int concurrency) {
  PlanInputs in;
  in.gpu = gpu;
  in.gpus = gpus;
  in.weights = weights;
  in.context = context;
  in.concurrency = concurrency;
  return in;
}

}  // namespace

TEST(WriteUps, Dense405BWeightsPerFormat) {
  const ModelSpec m = load_model_spec(config("llama-3.1-405b.json"));
  EXPECT_EQ(m.attention, AttentionKind::kGqa);
  EXPECT_NEAR(m.total_parameters() / 1e9, 405.85, 0.05);
  // BF16 "810 GB": 2 bytes per parameter.
  EXPECT_NEAR(m.weight_bytes("bf16") / 1e9, 810, 2.5);
  // FP8 "405 GB": 1 byte per parameter (+ block scales); embeddings and lm_head (4.2B) stay
  // bf16, which adds 4.2 GB: 410.2 GB.
  EXPECT_NEAR(m.weight_bytes("fp8") / 1e9, 410.2, 0.1);
  EXPECT_NEAR(m.weight_bytes("fp8") / 1e9, 405, 6);
  // MXFP4 "215 GB" = 405B x 4.25 bits. Every decoder linear layer at 4.25 bits (401.6B -> 213.4
  // GB) plus bf16 embeddings and lm_head (8.4 GB): 221.8 GB.
  EXPECT_NEAR(m.weight_bytes("mxfp4") / 1e9, 221.8, 0.1);
  EXPECT_NEAR(m.weight_bytes("mxfp4") / 1e9, 215, 8);
  EXPECT_LT(m.weight_bytes("mxfp4"), m.weight_bytes("mxfp6"));
  EXPECT_LT(m.weight_bytes("mxfp6"), m.weight_bytes("fp8"));
}

TEST(WriteUps, Gqa70BKvCache) {
  const ModelSpec m = load_model_spec(config("llama-3-70b.json"));
  EXPECT_NEAR(m.total_parameters() / 1e9, 70.55, 0.05);
  // 2 (K, V) x 8 KV heads x 128 x 80 layers x 2 bytes = 327,680 B: "0.33 MB per token".
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 327680.0);
  const PlanResult p = make_plan(m, inputs("h100", 8, "bf16", 131072, 1));
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 327680.0);
  // "43 GB at 128K": 131072 x 327,680 B = 42.95 GB.
  EXPECT_NEAR(p.kv_bytes_per_sequence / 1e9, 42.95, 0.01);
  EXPECT_TRUE(p.fits);  // 141 GB of weights + 43 GB on 8 x 80 GB
  const PlanResult fp8kv = make_plan(m, [] {
    PlanInputs in = inputs("h100", 8, "bf16", 131072, 1);
    in.kv_dtype = "fp8";
    return in;
  }());
  EXPECT_NEAR(fp8kv.kv_bytes_per_sequence / 1e9, 21.47, 0.01);
}

TEST(WriteUps, DeepSeekV3Fp8FitsOne8x288GbServer) {
  const ModelSpec m = load_model_spec(config("deepseek-v3.json"));
  EXPECT_EQ(m.attention, AttentionKind::kMla);
  EXPECT_EQ(m.moe_layers, 58);
  EXPECT_NEAR((m.total_parameters() - m.mtp_parameters()) / 1e9, 671, 1.5);
  EXPECT_NEAR(m.active_parameters / 1e9, 37.5, 1.0);  // published: 37B activated
  // MLA latent 512 + rope 64 per layer: 576 x 61 x 2 B.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 576.0 * 61 * 2);
  const PlanResult p = make_plan(m, inputs("mi355x", 8, "fp8", 32768, 64));
  EXPECT_NEAR(p.weight_bytes / 1e9, 685, 10);  // 671B + the 14B MTP module, about a byte each
  EXPECT_TRUE(p.fits);
  EXPECT_LT(p.weight_bytes, 8 * 288e9 * 0.9);
  EXPECT_GT(p.max_sequences, 64);
  // ... but not in BF16 on 8 x 141 GB.
  EXPECT_FALSE(make_plan(m, inputs("h200", 8, "bf16", 4096, 1)).fits);
}

TEST(WriteUps, Glm52Mxfp4On8Mi355xAnd4H200) {
  const ModelSpec m = load_model_spec(glm52());
  EXPECT_EQ(m.attention, AttentionKind::kMlaDsa);
  EXPECT_EQ(m.full_indexer_layers, 21);
  // bf16 latent 512 + rope 64 on 78 layers, bf16 indexer keys 128 on 21 full layers (as
  // glmserve caches them). An FP8 cache in glmserve's layout: 512 E4M3 + 4 fp32 scales + 64 bf16
  // rope values a layer, 128 E4M3 + one scale a full indexer layer.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 2), 2.0 * 576 * 78 + 2.0 * 128 * 21);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(m, 1), (512.0 + 16 + 128) * 78 + (128.0 + 4) * 21);

  const PlanResult mi = make_plan(m, inputs("mi355x", 8, "mxfp4", 21504, 64));
  EXPECT_GE(mi.weight_bytes / 1e9, 395);
  EXPECT_LE(mi.weight_bytes / 1e9, 440);
  EXPECT_TRUE(mi.fits);
  EXPECT_EQ(mi.gemm_rate.precision, "fp4");
  EXPECT_GT(mi.decode_tokens_per_s_bound, 2626);  // the write-up's measured node throughput is below the bound
  // TP8, TP4 x DP2, TP2 x DP4, TP1 x DP8 as replicas, then the same with the experts over all 8.
  ASSERT_EQ(mi.layouts.size(), 8u);
  EXPECT_EQ(mi.layouts[1].tp, 4);
  EXPECT_FALSE(mi.layouts[3].expert_parallel);
  EXPECT_TRUE(mi.layouts[7].expert_parallel);
  EXPECT_EQ(mi.layouts[7].tp, 1);
  EXPECT_EQ(mi.layouts[7].dp, 8);
  // DP8 + EP8: a GPU holds 32 experts a layer in MXFP4 (about 48 GB) and the rest in bf16.
  EXPECT_TRUE(mi.layouts[7].weights_fit);
  EXPECT_NEAR(mi.layouts[7].weight_bytes_per_gpu / 1e9, 85.6, 0.5);
  EXPECT_FALSE(mi.layouts[3].weights_fit);  // each replica with all 256 experts does not fit
  EXPECT_EQ(mi.layouts[1].dp, 2);
  EXPECT_TRUE(mi.layouts[2].weights_fit);         // 440 GB / 2 = 220 GB < 259 GB usable
  EXPECT_FALSE(mi.layouts[3].weights_fit);        // one GPU cannot hold it
  EXPECT_NEAR(mi.usd_per_million_tokens,
              usd_per_million_tokens(8 * 3.41, mi.decode_tokens_per_s_bound, 1.0), 1e-9);

  // 4 x H200 = 564 GB, 507.6 GB usable after the 10% reserve: the weights fit with KV room.
  const PlanResult h = make_plan(m, inputs("h200", 4, "mxfp4", 8192, 32));
  EXPECT_TRUE(h.fits);
  EXPECT_GT(h.headline.kv_room_per_replica / 1e9, 50);
  EXPECT_EQ(h.bandwidth.source, "measured");
  EXPECT_DOUBLE_EQ(h.bandwidth.value, 4.24e12);
  EXPECT_EQ(h.gemm_rate.precision, "fp8");
  EXPECT_DOUBLE_EQ(h.gemm_rate.value, 1417e12);
  EXPECT_GT(h.max_sequences, 32);
  EXPECT_FALSE(make_plan(m, inputs("h200", 4, "fp8", 8192, 1)).fits);  // 760 GB of FP8 does not
}

TEST(Plan, MoeStepBytesGrowWithBatch) {
  const ModelSpec m = load_model_spec(glm52());
  const double expert = m.expert_bytes("mxfp4");
  EXPECT_DOUBLE_EQ(expert, 3.0 * 6144 * 2048 * 4.25 / 8);
  const double one = decode_step_weight_bytes(m, "mxfp4", 1);
  const double many = decode_step_weight_bytes(m, "mxfp4", 1e6);
  EXPECT_NEAR(many - one, 75 * (256 - 8) * expert, 1.0);
  // Large batches read every expert: all weights but embeddings and the MTP layer.
  EXPECT_NEAR(many, double(m.weight_bytes("mxfp4")) - m.group_bytes("embed_tokens", "mxfp4") -
                        m.group_bytes("mtp", "mxfp4"), 1.0);
}

TEST(Plan, LayoutsTradeMemoryForAllReduce) {
  const ModelSpec m = load_model_spec(glm52());
  const PlanResult p = make_plan(m, inputs("mi355x", 8, "mxfp4", 21504, 64));
  const Layout& tp8 = p.layouts[0];
  const Layout& tp4 = p.layouts[1];
  EXPECT_DOUBLE_EQ(2 * tp8.weight_bytes_per_gpu, tp4.weight_bytes_per_gpu);
  // A second replica pays for a second copy of the weights: fewer sequences fit ...
  EXPECT_LT(tp4.max_sequences, tp8.max_sequences);
  // ... but each GPU sends less all-reduce traffic: 2 x 78 layers x 6144 x 2 B x 2(tp-1)/tp.
  EXPECT_DOUBLE_EQ(tp8.allreduce_bytes_per_token, 2.0 * 78 * 6144 * 2 * 2 * 7 / 8);
  EXPECT_DOUBLE_EQ(tp4.allreduce_bytes_per_token, 2.0 * 78 * 6144 * 2 * 2 * 3 / 4);
  EXPECT_DOUBLE_EQ(tp4.decode.batch, 32);
}

TEST(Plan, FitAndMaxSequences) {
  const ModelSpec m = load_model_spec(config("llama-3-70b.json"));
  PlanInputs in = inputs("h100", 2, "bf16", 131072, 1);
  const PlanResult p = make_plan(m, in);
  // 2 x 80 GB x 0.9 = 144 GB usable, 141.1 GB of weights: room for no 43 GB sequence.
  EXPECT_TRUE(p.headline.weights_fit);
  EXPECT_EQ(p.max_sequences, 0);
  EXPECT_FALSE(p.fits);
  in.gpus = 4;
  const PlanResult q = make_plan(m, in);
  const double room = 4 * 80e9 * 0.9 - double(m.weight_bytes("bf16"));
  EXPECT_EQ(q.max_sequences, static_cast<int64_t>(room / (327680.0 * 131072)));
  EXPECT_TRUE(q.fits);
  // More TP ranks than the 8 KV heads: each head is held by two ranks.
  in.gpus = 16;
  const PlanResult r = make_plan(m, in);
  EXPECT_DOUBLE_EQ(r.headline.kv_bytes_per_sequence, 2 * 327680.0 * 131072);
}

TEST(Plan, JsonKeysAndText) {
  const ModelSpec m = load_model_spec(glm52());
  PlanInputs in = inputs("h200", 4, "mxfp4", 8192, 16);
  in.usd_per_gpu_hour = 3.0;
  in.utilization = 0.5;
  const PlanResult p = make_plan(m, in, "glm-5.2.json");
  const auto j = nlohmann::json::parse(render_json(p));
  for (const char* key : {"params", "weight_bytes", "kv_bytes_per_token", "fits", "max_sequences",
                          "decode_tokens_per_s_bound", "usd_per_million_tokens", "layouts", "prefill"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["params"].get<int64_t>(), m.total_parameters());
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_NEAR(j["usd_per_million_tokens"].get<double>(),
              4 * 3.0 / (p.decode_tokens_per_s_bound * 0.5 * 3600) * 1e6, 1e-9);
  EXPECT_EQ(j["gpu"]["bandwidth_source"], "measured");
  const std::string text = render_text(p);
  EXPECT_NE(text.find("measured"), std::string::npos);
  EXPECT_NE(text.find("TP2 x DP2"), std::string::npos);
  EXPECT_NE(text.find("per million output tokens"), std::string::npos);

  in.measured_tokens_per_s = 1000;
  const PlanResult q = make_plan(m, in);
  EXPECT_EQ(q.cost_basis, "measured");
  EXPECT_NEAR(q.usd_per_million_tokens, 12.0 / (500 * 3600.0) * 1e6, 1e-9);
}

TEST(Plan, WorkloadBoundsCountItsPrefill) {
  // GLM-5.2 in MXFP4 on 8 H200s, the agentic requests (20k in, 60% cached, 1k out).
  const ModelSpec m = load_model_spec(glm52());
  PlanInputs in = inputs("h200", 8, "mxfp4", 8192, 64);
  in.usd_per_gpu_hour = 3.5;
  in.workload = {"agentic", 20000, 1000, 0.6};
  const PlanResult p = make_plan(m, in, "glm-5.2.json");
  const WorkloadBound& b = p.workload;
  // Decode at 21000 tokens reads more KV than the plan's 8192: below the headline bound.
  EXPECT_GT(b.decode_tokens_per_s_per_gpu, 0);
  EXPECT_LT(b.decode_tokens_per_s_per_gpu, p.decode_tokens_per_s_bound / 8);
  // The uncached tokens sit at positions 12000..20000: every one attends index_topk rows and its
  // indexer scores about 16000, so a token costs more than the mean of an 8192-token prompt.
  EXPECT_NEAR(mean_attended_tokens_between(m, 12000, 20000), m.index_topk, 1e-6);
  EXPECT_GT(b.prefill_flops_per_token, p.prefill_flops_per_token);
  EXPECT_NEAR(b.prefill_tokens_per_s_per_gpu, p.gemm_rate.value / b.prefill_flops_per_token, 1e-6);
  // A request: 1000 tokens of decode and 8000 of prefill, in turn.
  const double seconds = 1000 / b.decode_tokens_per_s_per_gpu + 8000 / b.prefill_tokens_per_s_per_gpu;
  EXPECT_NEAR(b.output_tokens_per_s_per_gpu, 1000 / seconds, 1e-6);
  EXPECT_NEAR(b.requests_per_s, 8 / seconds, 1e-9);
  EXPECT_NEAR(b.usd_per_thousand_requests, 8 * 3.5 / (b.requests_per_s * 3600) * 1e3, 1e-9);
  const auto j = nlohmann::json::parse(render_json(p));
  EXPECT_EQ(j["workload"]["name"], "agentic");
  EXPECT_NEAR(j["workload"]["output_tokens_per_s_per_gpu"].get<double>(), b.output_tokens_per_s_per_gpu, 1e-9);
  EXPECT_NE(render_text(p).find("per 1000 requests"), std::string::npos);
  // Without a workload: none in the plan.
  in.workload = {};
  EXPECT_FALSE(nlohmann::json::parse(render_json(make_plan(m, in))).contains("workload"));
  in.workload = {"x", 100, 0, 0.5};
  EXPECT_THROW(make_plan(m, in), Error);
}

TEST(Plan, ExpertParallelHeadlineIsTheLayoutServeRuns) {
  // --tp 1 --enable-expert-parallel on 8 H200s: the headline is DP8 attention + EP8 experts (about
  // 86 GB a GPU), the layout serve's lines size, not eight whole replicas (439 GB a GPU, no fit).
  const ModelSpec m = load_model_spec(glm52());
  PlanInputs in = inputs("h200", 8, "mxfp4", 8192, 64);
  in.tp = 1;
  const PlanResult replicas = make_plan(m, in);
  EXPECT_FALSE(replicas.headline.expert_parallel);
  EXPECT_FALSE(replicas.fits);
  in.expert_parallel = true;
  in.workload = {"agentic", 20000, 1000, 0.6};
  const PlanResult ep = make_plan(m, in);
  EXPECT_TRUE(ep.headline.expert_parallel);
  EXPECT_TRUE(ep.fits);
  EXPECT_DOUBLE_EQ(ep.headline.weight_bytes_per_gpu, plan_expert_parallel_layout(m, in, ep.gpu, 1).weight_bytes_per_gpu);
  EXPECT_LT(ep.headline.weight_bytes_per_gpu, 90e9);
  // A GPU's decode step reads no more than the GPU holds; with every expert touched (a large
  // batch) it reads nearly all of it (all but the embedding table's untouched rows).
  EXPECT_LE(ep.headline.decode.weight_bytes, ep.headline.weight_bytes_per_gpu);
  PlanInputs crowded = in;
  crowded.concurrency = 4096;
  const Layout busy = plan_expert_parallel_layout(m, crowded, ep.gpu, 1);
  EXPECT_GT(busy.decode.weight_bytes, 0.95 * (busy.weight_bytes_per_gpu - m.group_bytes("embed_tokens", "bf16")));
  EXPECT_LE(busy.decode.weight_bytes, busy.weight_bytes_per_gpu);
  const std::string text = render_text(ep);
  EXPECT_NE(text.find("TP1 x DP8 + EP8"), std::string::npos);
  // One GPU's share of its group's step, plus the collectives.
  EXPECT_NE(text.find("at 4.24 TB/s (1 x 4.24 TB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("  links"), std::string::npos);
  EXPECT_NEAR(ep.headline.decode.step_time_s,
              std::max(ep.headline.decode.bandwidth_time_s, ep.headline.decode.compute_time_s) +
                  ep.headline.allreduce_time_per_step_s,
              1e-12);
  // The workload's decode is that layout's at its length.
  PlanInputs at_length = in;
  at_length.context = 21000;
  EXPECT_NEAR(ep.workload.decode_tokens_per_s_per_gpu,
              plan_expert_parallel_layout(m, at_length, ep.gpu, 1).aggregate_tokens_per_s / 8, 1e-9);
}

TEST(Plan, RejectsBadInput) {
  const ModelSpec m = load_model_spec(glm52());
  PlanInputs in = inputs("h200", 8, "mxfp4", 8192, 1);
  in.tp = 3;
  EXPECT_THROW(make_plan(m, in), Error);
  EXPECT_THROW(make_plan(m, inputs("h200", 8, "int4", 8192, 1)), Error);
  EXPECT_THROW(make_plan(m, inputs("tpu", 8, "fp8", 8192, 1)), Error);
  EXPECT_THROW(make_plan(m, inputs("h200", 8, "fp8", 0, 1)), Error);
  EXPECT_THROW(parse_model_spec(R"({"model_type": "gpt2", "n_embd": 768})", "x"), Error);
  EXPECT_THROW(parse_model_spec(R"({"model_type": "llama", "hidden_size": 64})", "x"), Error);
  EXPECT_THROW(parse_model_spec(R"({"model_type": "llama", "hidden_size": -64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 10})", "x"), Error);
  EXPECT_THROW(parse_model_spec("[1, 2]", "x"), Error);
  EXPECT_THROW(parse_model_spec("{", "x"), Error);
}

// Owning the GPUs: each part per GPU-hour from its assumption (hand-computed), the plan's price
// when no GPU-hour price is given, and inputs outside their sense refused.
TEST(Plan, OwnedGpusPriceTheGpuHourByParts) {
  TcoInputs t;
  t.gpu_price = 30000;
  t.host_price_per_gpu = 5040;
  t.years = 4;
  t.usd_per_kwh = 0.12;
  t.pue = 1.5;
  t.host_watts_per_gpu = 300;
  t.power_share = 0.8;
  t.usd_per_kw_month = 146;
  t.maintenance_per_year = 0.1;
  const TcoBreakdown b = tco_per_gpu_hour(t, 700);
  EXPECT_NEAR(b.hardware, 35040.0 / (4 * 8760), 1e-12);  // $1.00
  EXPECT_NEAR(b.it_kw, 0.8, 1e-12);                       // (700 + 300) W at 80%
  EXPECT_NEAR(b.power, 0.8 * 0.12, 1e-12);
  EXPECT_NEAR(b.cooling, 0.8 * 0.12 * 0.5, 1e-12);
  EXPECT_NEAR(b.space, 0.8 * 146 / 730, 1e-12);           // a month is 730 hours
  EXPECT_NEAR(b.maintenance, 3504.0 / 8760, 1e-12);
  EXPECT_NEAR(b.total(), 1.0 + 0.096 + 0.048 + 0.16 + 0.4, 1e-9);

  const ModelSpec m = load_model_spec(glm52());
  PlanInputs in = inputs("h200", 8, "mxfp4", 8192, 64);
  in.tco = t;
  const PlanResult owned = make_plan(m, in);
  EXPECT_TRUE(owned.has_tco);
  EXPECT_EQ(owned.price_basis, "owned (TCO)");
  EXPECT_NEAR(owned.tco.power, 0.8 * 0.12, 1e-12);  // from the catalogue's H200 board power of 700 W
  EXPECT_DOUBLE_EQ(owned.usd_per_gpu_hour, owned.tco.total());
  EXPECT_NEAR(owned.usd_per_million_tokens, usd_per_million_tokens(8 * owned.tco.total(), owned.decode_tokens_per_s_bound, 1.0),
              1e-9);
  const auto j = nlohmann::json::parse(render_json(owned));
  EXPECT_NEAR(j["tco"]["usd_per_gpu_hour"].get<double>(), b.total(), 1e-9);
  EXPECT_NE(render_text(owned).find("per GPU-hour owned"), std::string::npos);
  in.usd_per_gpu_hour = 2.5;  // a given price wins, the TCO stays beside it
  const PlanResult given = make_plan(m, in);
  EXPECT_EQ(given.price_basis, "given");
  EXPECT_DOUBLE_EQ(given.usd_per_gpu_hour, 2.5);
  EXPECT_TRUE(given.has_tco);
  EXPECT_EQ(make_plan(m, inputs("h200", 8, "mxfp4", 8192, 64)).price_basis, "catalogue rental");

  t.pue = 0.9;
  EXPECT_THROW(tco_per_gpu_hour(t, 700), Error);
  t.pue = 1.2;
  t.years = 0;
  EXPECT_THROW(tco_per_gpu_hour(t, 700), Error);
}

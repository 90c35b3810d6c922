// The planner's arithmetic: KV cache sizes, decode and prefill rooflines, tensor- versus
// data-parallel layouts and cost. Every formula is explained in docs/planning.md; each function
// here is one of them, so tests can check it on hand-computed cases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/model_spec.h"
#include "plan/tco.h"

namespace glms::plan {

// ---- formulas ----
// Bytes per element of the KV cache dtype: bf16 2, fp8 1.
int kv_dtype_bytes(const std::string& kv_dtype);
// Expected number of distinct experts a batch of `batch` tokens touches in one MoE layer when
// each picks top_k of `experts` uniformly: E * (1 - (1 - k/E)^B).
double expected_distinct_experts(int experts, int top_k, double batch);
// KV cache bytes stored per token (all decoder layers):
//   GQA: 2 * kv_heads * head_dim * layers * b;  MLA: (kv_lora + rope) * layers * b;
//   MLA + DSA: MLA + index_head_dim * full_indexer_layers * b (the indexer keys in the cache's
//   precision, as glmserve's CUDA cache keeps them). An FP8 MLA cache (b 1) is glmserve's layout
//   (quant/kv_fp8.h): E4M3 latent with a scale per 128, the rope key in bf16, each indexer key
//   with a scale (GLM-5: 656 + 132 bytes a layer).
double kv_bytes_per_token(const ModelSpec& m, int kv_bytes);
// KV bytes one decode step reads for one sequence at position `position`: GQA and MLA read the
// whole context; with DSA the attention reads only the top-k tokens (min(position, index_topk))
// and the indexer reads its keys for the whole context on the full layers.
double kv_bytes_read_per_step(const ModelSpec& m, double position, int kv_bytes);
// Attention FLOPs of one token attending to `attended` tokens (indexer scores `scored` tokens
// on its full layers). Decode uses the absorbed MLA form: 2*heads*(2*kv_lora + rope) per token;
// prefill the expanded form: 2*heads*(qk_head + v_head). GQA: 4*heads*head_dim.
double attention_flops(const ModelSpec& m, double attended, double scored, bool prefill);
// Tokens a query attends to at `position` (DSA caps at index_topk), and the mean over a causal
// prompt of `length` tokens: (1/L) * sum_{i=1..L} min(i, cap).
double attended_tokens(const ModelSpec& m, double position);
double mean_attended_tokens(const ModelSpec& m, double length);
// The same mean over prompt positions [first, last) (a prompt's uncached part after `first`
// cached tokens): (last mean(last) - first mean(first)) / (last - first).
double mean_attended_tokens_between(const ModelSpec& m, double first, double last);
// Parameters whose FLOPs every token pays: active parameters (lm_head excluded for prefill,
// where only the last token of a prompt needs logits).
double lm_head_parameters(const ModelSpec& m);
// Weight bytes one decode step reads at `batch` sequences: everything but embeddings, the MTP
// layer and routed experts, plus moe_layers * distinct experts * bytes of one expert.
double decode_step_weight_bytes(const ModelSpec& m, const std::string& format, double batch);
// Ring all-reduce bytes sent per GPU per token: 2 all-reduces per layer of hidden bf16 values,
// each moving 2 * (tp - 1) / tp of the message.
double allreduce_bytes_per_token(const ModelSpec& m, int tp);
double usd_per_million_tokens(double usd_per_hour, double tokens_per_s, double utilization);
double tokens_per_s_per_megawatt(double tokens_per_s, double watts);
// Output tokens a second a GPU serves when each request brings input_len prompt tokens, of which
// prefix_hit were cached, and generates output_len, the GPU decoding at decode_tokens_per_s and
// prefilling at prefill_tokens_per_s (both per GPU, each measured alone): a request costs
// output_len / decode + input_len (1 - prefix_hit) / prefill seconds of the GPU. Steps that mix
// prefill chunks into decode batches share the weights' reads, so a server does at least this.
double mixed_output_tokens_per_s(double decode_tokens_per_s, double prefill_tokens_per_s, int input_len,
                                 int output_len, double prefix_hit);

struct DecodeBound {
  double batch = 0;               // sequences decoding together in one replica
  double touched_experts = 0;     // per MoE layer
  double weight_bytes = 0;        // per step
  double kv_bytes = 0;            // per step, all sequences
  double flops = 0;               // per step
  double bandwidth_time_s = 0;    // (weight + kv bytes) / (gpus * bandwidth)
  double compute_time_s = 0;      // flops / (gpus * gemm rate)
  bool compute_bound = false;
  double step_time_s = 0;         // max of the two
  double tokens_per_s = 0;        // batch / step time (one replica)
  double tokens_per_s_per_sequence = 0;
};
DecodeBound decode_bound(const ModelSpec& m, const std::string& format, int kv_bytes, double position,
                         double batch, int gpus, double bandwidth, double gemm_rate);

// ---- a whole plan ----
struct PlanInputs {
  std::string gpu = "mi355x";
  int gpus = 8;
  int tp = 0;                       // tensor-parallel size of the headline layout; 0: all GPUs
  std::string weights = "mxfp4";
  std::string kv_dtype = "bf16";
  int64_t context = 8192;
  int concurrency = 64;
  double usd_per_gpu_hour = -1;     // < 0: the TCO's where a GPU price is given, else the catalogue price
  TcoInputs tco;                    // owning the GPUs (tco.gpu_price > 0), plan/tco.h
  double utilization = 1.0;
  double reserve_fraction = 0.10;   // of each GPU's memory, for activations, workspaces, runtime
  double measured_tokens_per_s = 0; // > 0: cost from this throughput instead of the bound
  // How `glmserve serve` would run it (the serve memory section; glm_moe_dsa configs): the
  // experts over all GPUs (--enable-expert-parallel), the step limits that size its workspaces
  // (--max-num-batched-tokens; --max-num-seqs, 0: concurrency; the context is --max-model-len),
  // the cache block, and the MTP layer's weights and cache (--speculative mtp, with draft steps).
  bool expert_parallel = false;
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 0;
  int block_size = 16;
  int speculative_steps = 0;
  // A workload to project the headline layout's bounds to (bench's presets; input_len 0: none):
  // requests of input_len prompt tokens, prefix_hit of them cached, and output_len generated.
  struct Workload {
    std::string name;
    int input_len = 0, output_len = 0;
    double prefix_hit = 0;
  } workload;
};

struct Layout {
  int tp = 1, dp = 1;
  // Data-parallel attention groups sharing the routed experts over all tp x dp GPUs (glmserve's
  // --enable-expert-parallel: plan/parallel.h), rather than dp whole replicas. Then weights/GPU
  // is what glmserve holds on the GPU (experts in the format, the rest bf16, no MTP layer), the
  // latent cache is replicated over each group's TP ranks, and the all-reduce columns hold every
  // collective of a step (the MoE gathers and reduce-scatters too).
  bool expert_parallel = false;
  double weight_bytes_per_gpu = 0;
  bool weights_fit = false;
  double kv_room_per_replica = 0;       // bytes left for KV in one replica
  double kv_bytes_per_sequence = 0;     // in one replica, with any replication across TP ranks
  int64_t max_sequences = 0;            // all replicas, at the planned context
  DecodeBound decode;                   // one replica at concurrency / dp sequences
  double aggregate_tokens_per_s = 0;    // all replicas
  double allreduce_bytes_per_token = 0; // per GPU
  double allreduce_time_per_step_s = 0; // per replica step, at the link bandwidth
};

// What `glmserve serve` holds on each GPU of a layout (model/cuda_memory.h's workspaces, the
// weights as its CUDA path stores them) and the cache that the budget, gpu_memory_utilization of
// the GPU (1 - reserve_fraction), leaves: the figures its start-up log prints per rank.
struct ServeMemory {
  bool known = false;  // a glm_moe_dsa config: the others are planned by the reserve alone
  int tp = 1, dp = 1;
  bool expert_parallel = false;
  double budget = 0, weights = 0, workspaces = 0, runtime = 0, margin = 0, cache = 0;  // bytes per GPU
  int64_t cache_blocks = 0, cache_tokens = 0;  // per data-parallel rank
  bool fits = false;                           // a cache of at least one max-model-len sequence
};

// The headline layout's bounds for PlanInputs::workload's requests: decode at the layout's
// concurrency with every sequence at input_len + output_len, prefill of the uncached prompt
// tokens (after the cached ones) at the GEMM rate, taken in turn (mixed_output_tokens_per_s).
struct WorkloadBound {
  double decode_tokens_per_s_per_gpu = 0;
  double prefill_flops_per_token = 0;      // an uncached prompt token
  double prefill_tokens_per_s_per_gpu = 0;
  double output_tokens_per_s_per_gpu = 0;
  double requests_per_s = 0;               // all GPUs
  double usd_per_thousand_requests = 0;    // at the plan's price and utilisation
};

struct PlanResult {
  PlanInputs inputs;
  GpuSpec gpu;
  ModelSpec model;
  std::string source;                   // config path
  Rate bandwidth, gemm_rate;
  double usable_bytes_per_gpu = 0;
  int64_t params = 0, active_params = 0, mtp_params = 0;
  double weight_bytes = 0;
  double kv_bytes_per_token = 0, kv_bytes_per_sequence = 0;
  double kv_bytes_needed = 0;           // concurrency x context (with replication)
  bool fits = false;
  int64_t max_sequences = 0;
  Layout headline;
  ServeMemory serve;                    // glmserve serve on the headline layout (--tp, --enable-expert-parallel)
  std::vector<Layout> layouts;          // TP over all GPUs, then halving TP, doubling replicas; then the
                                        // same TP x DP with expert parallelism
  double prefill_flops_per_token = 0;
  double prefill_tokens_per_s_bound = 0;  // all GPUs busy with prefill
  double ttft_bound_s = 0;                // one prompt of `context` tokens on one replica
  double decode_tokens_per_s_bound = 0;
  double decode_tokens_per_s_per_sequence_bound = 0;
  double usd_per_gpu_hour = 0;
  std::string price_basis;              // "owned (TCO)", "given" (--gpu-hour-price) or "catalogue rental"
  bool has_tco = false;
  TcoBreakdown tco;                     // per GPU-hour, where a GPU price is given
  double cost_tokens_per_s = 0;         // throughput the cost is computed from
  std::string cost_basis;               // "decode bound" or "measured"
  double usd_per_million_tokens = 0;
  double tokens_per_s_per_megawatt = 0;
  WorkloadBound workload;               // where inputs.workload names one
};

PlanResult make_plan(const ModelSpec& model, const PlanInputs& inputs, const std::string& source = "");
Layout plan_layout(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, int tp);
// TP `tp` x DP gpus / tp with the experts over every GPU (plan/parallel.cpp).
Layout plan_expert_parallel_layout(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, int tp);

std::string render_text(const PlanResult& plan);
std::string render_json(const PlanResult& plan);

}  // namespace glms::plan

// One rank of a parallel layout as glmserve's runtime lays it out (model/shard.h): what it holds,
// what a decode step reads, and what its collectives send. Tensor-parallel ranks split the
// attention heads' matrices (q_b, kv_b, o_proj; q_a and kv_a stay whole), the dense MLP and the
// shared expert; the DSA indexer, router, norms, embeddings and lm_head are whole on every rank;
// the routed experts spread over all tp x dp ranks (whole experts with expert parallelism, or
// every expert split by width: the same bytes per rank).
#pragma once

#include <string>

#include "plan/model_spec.h"
#include "plan/roofline.h"

namespace glms::plan {

struct RankShape {
  int tp = 1, dp = 1;
  int world() const { return tp * dp; }
};

// Weight bytes one rank holds in `format` (the MTP layer left out).
double rank_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r);
// The same as glmserve's CUDA path stores them: routed experts in `experts_format`, every other
// matrix bf16, the router fp32 (MX and FP8 checkpoints are widened on upload but for the experts).
double rank_device_weight_bytes(const ModelSpec& m, const std::string& experts_format, const RankShape& r);
// Weight bytes one rank reads in a decode step with `tokens_per_rank` tokens on each
// data-parallel rank: its share of every non-expert matrix, and of the experts the whole step's
// dp * tokens_per_rank tokens touch.
double rank_decode_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r,
                                double tokens_per_rank);
// The same as glmserve's CUDA path holds the weights (rank_device_weight_bytes: bf16 but the
// routed experts, read in `experts_format`): what its decode steps read, and bench-step's bound.
double rank_decode_device_weight_bytes(const ModelSpec& m, const std::string& experts_format, const RankShape& r,
                                       double tokens_per_rank);

// What glmserve serve holds on each GPU of the layout tp x dp (the experts over all of them,
// whole with expert_parallel) and the cache the rest of the budget takes (PlanInputs says how
// serve is run); `known` is false for configs other than glm_moe_dsa.
ServeMemory serve_memory(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, const RankShape& r,
                         bool expert_parallel);

// A step's collectives on one rank (ring algorithms: an all-reduce of S bytes over n ranks sends
// 2 (n - 1) / n S, an all-gather or reduce-scatter of n chunks of c bytes sends (n - 1) c): per
// decoder layer two all-reduces of the fp32 block outputs over the tensor-parallel peers, and per
// MoE layer with data parallelism an all-gather of every rank's routing (ids and weights, 8 bytes
// an expert) and bf16 rows (one group call), and a reduce-scatter of the partial sums: bf16 where
// `bf16_moe_sums` (CudaModelOptions::bf16_moe_reduce_scatter; without the argument, its default),
// else fp32.
struct StepCollectives {
  double bytes_sent = 0;  // by one rank
  int count = 0;          // collective calls
  // At `link_bandwidth` bytes/s per direction and `latency_s` a call.
  double time_s(double link_bandwidth, double latency_s) const;
};
StepCollectives step_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank);
StepCollectives step_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank, bool bf16_moe_sums);
// The same for one MoE decoder layer (an MTP draft step's): two all-reduces over the
// tensor-parallel peers, an all-gather group and a reduce-scatter over the data-parallel ones.
StepCollectives moe_layer_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank);
StepCollectives moe_layer_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank,
                                      bool bf16_moe_sums);

// A collective's fixed cost assumed where none is measured: NVLink rings inside a CUDA graph.
inline constexpr double kCollectiveLatencySeconds = 10e-6;

}  // namespace glms::plan

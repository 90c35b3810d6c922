// bench-step --simulate-rank R --world N --layout dp-ep|tp|tp-ep: one rank of a layout at full
// depth on one GPU. The rank holds exactly its shard (its experts, its heads) and runs its batch;
// each collective becomes device copies of the bytes it would bring in (runtime::
// make_simulated_peer), and the collectives' network time is added from the plan's link
// bandwidth (plan/parallel.h). With data parallelism every rank is taken to run as many tokens as
// this one.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "io/model_config.h"
#include "model/batch.h"
#include "model/shard.h"
#include "plan/model_spec.h"
#include "plan/parallel.h"
#include "runtime/layout.h"

namespace glms::cli {

// The layout is --world N with --layout dp-ep (DP attention + EP MoE), tp (TP, experts split by
// width) or tp-ep (TP + EP), or given as vLLM's flags (--tensor-parallel-size, --data-parallel-size,
// --enable-expert-parallel), which then win.
struct RankSimulation {
  int rank = 0, world = 1;
  std::string layout = "dp-ep";
  runtime::ParallelLayout flags;  // from vLLM's flags; world size 1: not given

  bool enabled() const { return world > 1 || flags.world_size() > 1; }
  runtime::ParallelLayout parallel_layout() const;
  plan::RankShape rank_shape() const { return {parallel_layout().tensor_parallel, parallel_layout().data_parallel}; }
  // Sets batch.dp_peers: every data-parallel rank runs a step like this rank's; none without DP.
  void set_dp_peers(model::ForwardBatch& batch) const;
};

// The stand-in peers of the simulated rank.
struct SimulatedPeers {
  std::unique_ptr<comm::Communicator> tp, dp;
  model::Peers peers() const { return {tp.get(), dp.get()}; }
};
SimulatedPeers make_simulated_peers(const RankSimulation& sim, const io::ModelConfig& config, int max_tokens);

// The write-ups' node (REFERENCE.md: 8 x MI355X, GLM-5.2 MXFP4, SGLang TP4 x DP2 with MTP, the
// agentic workload at 2.4 req/s): 2626 output tok/s, per GPU.
inline constexpr double kWriteupOutputTokensPerSPerGpu = 2626.0 / 8;

// A point's projection: the measured step (compute and local copies) plus the collectives' time
// at the link bandwidth, per rank and for the node of `world` GPUs; `bf16_moe_sums`: the MoE
// reduce-scatters in bf16 (CudaModelOptions::bf16_moe_reduce_scatter).
nlohmann::json project_step(const plan::ModelSpec& spec, const RankSimulation& sim, double measured_s,
                            int tokens_per_rank, double link_bandwidth, bool bf16_moe_sums);

// Acceptance lengths (tokens a speculative step yields per sequence) the projections are given at.
inline constexpr double kProjectedAcceptanceLengths[] = {1.5, 2.0, 2.5, 3.0, 3.5};

// A simulated rank's MTP speculative step, K drafts at `batch` sequences a rank: the measured
// verify (batch (1 + K) tokens) with the whole model's collectives, and K measured draft steps each
// with one MoE layer's (the MTP layer), and the output tok/s per GPU that gives at each of
// kProjectedAcceptanceLengths.
nlohmann::json project_speculation(const plan::ModelSpec& spec, const RankSimulation& sim, double verify_s,
                                   double draft_s, int batch, int K, double link_bandwidth, bool bf16_moe_sums);

}  // namespace glms::cli

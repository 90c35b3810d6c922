#include "cli/bench_step_rank.h"

#include <fmt/format.h>

#include "core/error.h"

#ifdef GLMS_HAVE_CUDA
#include "runtime/device_collectives.h"
#endif

namespace glms::cli {

runtime::ParallelLayout RankSimulation::parallel_layout() const {
  if (flags.world_size() > 1) return flags;
  if (layout == "dp-ep") return {1, world, true};
  if (layout == "tp") return {world, 1, false};
  if (layout == "tp-ep") return {world, 1, true};
  fail("--layout must be dp-ep, tp or tp-ep, got '" + layout + "'");
}

void RankSimulation::set_dp_peers(model::ForwardBatch& batch) const {
  const int dp = parallel_layout().data_parallel;
  batch.dp_peers.assign(dp > 1 ? dp : 0, model::dp_step_shape(batch));
}

SimulatedPeers make_simulated_peers(const RankSimulation& sim, const io::ModelConfig& config, int max_tokens) {
  SimulatedPeers out;
#ifdef GLMS_HAVE_CUDA
  const runtime::ParallelLayout l = sim.parallel_layout();
  const model::ModelShard shard = l.shard(sim.rank);
  const size_t all_reduce_bytes = sizeof(float) * static_cast<size_t>(max_tokens) * config.hidden_size;
  if (l.tensor_parallel > 1)
    out.tp = runtime::make_simulated_peer(shard.tp_rank, l.tensor_parallel, config.n_routed_experts, all_reduce_bytes);
  if (l.data_parallel > 1)
    out.dp = runtime::make_simulated_peer(shard.dp_rank, l.data_parallel, config.n_routed_experts, all_reduce_bytes);
#else
  (void)sim;
  (void)config;
  (void)max_tokens;
#endif
  return out;
}

nlohmann::json project_step(const plan::ModelSpec& spec, const RankSimulation& sim, double measured_s,
                            int tokens_per_rank, double link_bandwidth, bool bf16_moe_sums) {
  const plan::RankShape r = sim.rank_shape();
  const plan::StepCollectives c = plan::step_collectives(spec, r, tokens_per_rank, bf16_moe_sums);
  const double collectives_s = c.time_s(link_bandwidth, plan::kCollectiveLatencySeconds);
  const double step_s = measured_s + collectives_s;
  // Tokens the node finishes per step: each data-parallel rank's own, or the one shared batch.
  const double node_tokens = double(tokens_per_rank) * r.dp;
  return {{"collective_calls", c.count},
          {"collective_bytes_sent", c.bytes_sent},
          {"collectives_ms", collectives_s * 1e3},
          {"projected_step_ms", step_s * 1e3},
          {"projected_node_tokens_per_s", node_tokens / step_s},
          {"projected_tokens_per_s_per_gpu", node_tokens / step_s / r.world()}};
}

nlohmann::json project_speculation(const plan::ModelSpec& spec, const RankSimulation& sim, double verify_s,
                                   double draft_s, int batch, int K, double link_bandwidth, bool bf16_moe_sums) {
  const plan::RankShape r = sim.rank_shape();
  const double latency = plan::kCollectiveLatencySeconds;
  const double verify_with =
      verify_s +
      plan::step_collectives(spec, r, double(batch) * (K + 1), bf16_moe_sums).time_s(link_bandwidth, latency);
  const double draft_with =
      draft_s + plan::moe_layer_collectives(spec, r, batch, bf16_moe_sums).time_s(link_bandwidth, latency);
  const double step_s = verify_with + K * draft_with;
  nlohmann::json rates = nlohmann::json::object();
  for (const double a : kProjectedAcceptanceLengths)
    rates[fmt::format("{:.1f}", a)] = a * batch * r.dp / step_s / r.world();  // each DP rank's own sequences
  return {{"verify_ms", verify_with * 1e3},
          {"draft_step_ms", draft_with * 1e3},
          {"speculative_step_ms", step_s * 1e3},
          {"output_tokens_per_s_per_gpu_at_acceptance_length", rates}};
}

}  // namespace glms::cli

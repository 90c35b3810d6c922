// Backend over the real engine::Engine.
#include "engine/engine.h"
#include "kv/latent_cache.h"
#include "server/backend.h"

namespace glms::server {
namespace {

class EngineBackend final : public Backend {
 public:
  EngineBackend(engine::Engine& engine, std::vector<RankMemory> rank_memory,
                std::function<std::vector<DeviceMemory>()> device_memory)
      : engine_(engine), rank_memory_(std::move(rank_memory)), device_memory_(std::move(device_memory)) {}

  uint64_t submit(engine::RequestParams params, engine::OutputCallback on_output) override {
    return engine_.submit(std::move(params), std::move(on_output));
  }
  void cancel(uint64_t request_id) override { engine_.cancel(request_id); }
  BackendStats stats() const override {
    const engine::EngineStats s = engine_.stats();
    BackendStats out;
    out.num_running = s.num_running;
    out.num_waiting = s.num_waiting;
    out.num_blocks = s.num_blocks;
    out.num_free_blocks = s.num_free_blocks;
    out.kv_cache_usage = s.kv_cache_usage;
    for (const engine::RankStats& r : s.ranks) out.kv_cache_usage_by_rank.push_back(r.kv_cache_usage);
    out.prefix_cache_queries = s.prefix_cache_queries;
    out.prefix_cache_hits = s.prefix_cache_hits;
    out.prompt_tokens_total = s.prompt_tokens_total;
    out.generation_tokens_total = s.generation_tokens_total;
    out.num_preemptions = s.num_preemptions;
    out.spec_drafts = s.spec_drafts;
    out.spec_draft_tokens = s.spec_draft_tokens;
    out.spec_accepted_tokens = s.spec_accepted_tokens;
    out.spec_accepted_per_position = s.spec_accepted_per_position;
    out.iteration_token_buckets = engine::kIterationTokenBuckets;
    out.iteration_tokens = s.iteration_tokens;
    out.iteration_tokens_sum = s.iteration_tokens_sum;
    out.cache_dtype = kv::cache_dtype_name(engine_.config().kv_cache_dtype);
    out.block_size = engine_.config().block_size;
    out.prefix_caching = engine_.config().enable_prefix_cache;
    out.gpu_memory_utilization = engine_.config().gpu_memory_utilization;
    out.rank_memory = rank_memory_;
    return out;
  }
  int max_model_len() const override {
    const int configured = engine_.config().max_model_len;
    return configured > 0 ? configured : static_cast<int>(engine_.model_config().max_position_embeddings);
  }
  int vocab_size() const override { return static_cast<int>(engine_.model_config().vocab_size); }
  void drain(double timeout_seconds) override { engine_.drain(timeout_seconds); }
  std::optional<int> reset_prefix_cache() override { return engine_.reset_prefix_cache(); }
  std::vector<DeviceMemory> device_memory() const override {
    return device_memory_ ? device_memory_() : std::vector<DeviceMemory>{};
  }

 private:
  engine::Engine& engine_;
  std::vector<RankMemory> rank_memory_;
  std::function<std::vector<DeviceMemory>()> device_memory_;
};

}  // namespace

std::unique_ptr<Backend> make_engine_backend(engine::Engine& engine, std::vector<RankMemory> rank_memory,
                                             std::function<std::vector<DeviceMemory>()> device_memory) {
  return std::make_unique<EngineBackend>(engine, std::move(rank_memory), std::move(device_memory));
}

}  // namespace glms::server

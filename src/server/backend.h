// What the HTTP side needs from the engine, behind a small interface: the real engine::Engine
// (engine_backend.cpp) in the binary, a scripted fake in the unit tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <memory>
#include <optional>

#include "engine/request.h"

namespace glms::engine {
class Engine;
struct EngineStats;
}

namespace glms::server {

// A GPU's memory as the driver reports it at the scrape: in use by every process, and in all.
struct DeviceMemory {
  int device = 0;
  int64_t used_bytes = 0, total_bytes = 0;
};

// What a rank allocated at start-up: its share of the weights and its KV cache.
struct RankMemory {
  int64_t weight_bytes = 0, cache_bytes = 0;
};

struct BackendStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_blocks = 0;
  int num_free_blocks = 0;
  double kv_cache_usage = 0.0;       // [0, 1]
  std::vector<double> kv_cache_usage_by_rank;  // [data-parallel ranks] each rank's own pool
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions = 0;
  int64_t spec_drafts = 0;           // speculative decoding: verification steps, drafts proposed,
  int64_t spec_draft_tokens = 0;     // accepted, and accepted by draft position (empty without
  int64_t spec_accepted_tokens = 0;  // speculation)
  std::vector<int64_t> spec_accepted_per_position;
  // Tokens per engine step: counts per bucket of `iteration_token_buckets` (one more for larger).
  std::vector<double> iteration_token_buckets;
  std::vector<int64_t> iteration_tokens;
  int64_t iteration_tokens_sum = 0;
  // The cache's configuration (vLLM's cache_config_info).
  std::string cache_dtype = "auto";  // --kv-cache-dtype: auto (the model's bf16) or fp8_e4m3
  int block_size = 0;
  bool prefix_caching = true;
  double gpu_memory_utilization = 0;
  std::vector<RankMemory> rank_memory;      // [ranks of the layout]
  std::vector<DeviceMemory> device_memory;  // [the GPUs the layout uses]: only /metrics reads them (device_memory())
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Same contract as engine::Engine::submit: outputs arrive through `on_output` (on any thread)
  // until one has finished = true. Throws engine::QueueFull when the queue is full and
  // glms::Error for a request the engine rejects.
  virtual uint64_t submit(engine::RequestParams params, engine::OutputCallback on_output) = 0;
  // Ends a request; safe for unknown or finished ids; must not be called from inside on_output.
  virtual void cancel(uint64_t request_id) = 0;
  virtual BackendStats stats() const = 0;
  virtual int max_model_len() const = 0;   // prompt + generated tokens per request
  virtual int vocab_size() const = 0;
  // Stops taking requests and waits for every in-flight one to finish; those still running after
  // `timeout_seconds` end with an error (0: no deadline).
  virtual void drain(double timeout_seconds) = 0;
  // Empties the prefix cache: the blocks freed, or nothing while requests are in flight
  // (engine::Engine::reset_prefix_cache).
  virtual std::optional<int> reset_prefix_cache() = 0;
  // The GPUs' memory now, from the driver (empty on the CPU): for /metrics' scrapes only.
  virtual std::vector<DeviceMemory> device_memory() const { return {}; }
};

// Adapts a running engine (which must outlive the adapter). `rank_memory`: what each rank
// allocated; `device_memory` (may be empty): reads the GPUs' memory (Backend::device_memory).
std::unique_ptr<Backend> make_engine_backend(engine::Engine& engine, std::vector<RankMemory> rank_memory = {},
                                             std::function<std::vector<DeviceMemory>()> device_memory = {});

}  // namespace glms::server

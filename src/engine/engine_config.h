// What the engine is set up with (EngineConfig) and what it reports (EngineStats).
#pragma once

#include <algorithm>

#include <cstdint>
#include <vector>

#include "kv/latent_cache.h"

namespace glms::engine {

// Limits are per data-parallel rank (each runs its own batch in every step).
struct EngineConfig {
  int max_num_seqs = 64;            // sequences in one step at most
  int max_batch_tokens = 2048;      // tokens in one step at most (prefill chunks fill the rest)
  // Memory for each data-parallel rank's latent cache. 0: on a GPU, what gpu_memory_utilization
  // leaves after the weights and workspaces; on the CPU, enough for max_num_seqs x max_model_len
  // up to 2 GiB.
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.9;  // fraction of each GPU's memory the engine may hold in all
  kv::CacheDtype kv_cache_dtype = kv::CacheDtype::kAuto;  // --kv-cache-dtype
  int max_model_len = 0;            // prompt + generated tokens per request; 0 = the model's limit
  int block_size = 16;              // tokens per cache block
  int max_waiting = 1024;           // queued requests beyond which submit() is refused
  bool enable_prefix_cache = true;
  // > 0: decodes draft this many tokens with the model's MTP layer and verify them in the step's
  // forward (speculative rejection sampling: greedy output unchanged, sampled output equally
  // distributed). Requests with presence/frequency/repetition penalties decode plainly.
  int speculative_steps = 0;
  // Steps with more decoding sequences than this decode them plainly (the MTP layer still runs
  // over their new tokens, so drafting resumes when the batch shrinks); 0: no limit. Verifying
  // K drafts touches up to K + 1 times the experts of one token, so speculation pays at small
  // batches only (docs/performance.md, "Where MTP speculation pays").
  int speculative_max_batch = 32;
  // On a device runner (CUDA), a structured-output request that needs its logits for nothing
  // else (no penalties, logit_bias, min_tokens or logprobs) sends the constraint's token mask
  // with its row and gets back only the token, masked and drawn on the device; false: its whole
  // row comes back and is masked on the host. The CPU runner always masks on the host (the
  // engine turns this off there).
  bool device_token_masks = true;
};

// Logits rows one step may return per data-parallel rank (the runners' workspaces are sized by
// it): every sequence's next-token row, or 1 + drafts when verifying.
inline int max_logits_rows(const EngineConfig& c) {
  return std::min(c.max_batch_tokens, c.max_num_seqs * (1 + std::max(0, c.speculative_steps)));
}

// One data-parallel rank's cache (its own pool and prefix cache).
struct RankStats {
  int num_running = 0;
  int num_blocks = 0;
  int num_free_blocks = 0;          // free or holding only evictable cached prefixes
  int num_cached_blocks = 0;        // blocks held by the prefix cache with no running user
  double kv_cache_usage = 0.0;      // fraction of blocks in use by running requests
  int64_t prefix_cache_queries = 0; // prompt tokens looked up
  int64_t prefix_cache_hits = 0;    // prompt tokens found

  // Adds another rank's counts (kv_cache_usage is then recomputed from the sums).
  void add(const RankStats& r) {
    num_running += r.num_running;
    num_blocks += r.num_blocks;
    num_free_blocks += r.num_free_blocks;
    num_cached_blocks += r.num_cached_blocks;
    prefix_cache_queries += r.prefix_cache_queries;
    prefix_cache_hits += r.prefix_cache_hits;
    kv_cache_usage = num_blocks > 0 ? 1.0 - static_cast<double>(num_free_blocks) / num_blocks : 0.0;
  }
};

// vLLM's iteration_tokens_total buckets.
inline const std::vector<double> kIterationTokenBuckets = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

// Counters and gauges for /metrics and the bench; a consistent snapshot. The cache figures
// (the RankStats part) sum over the data-parallel ranks, which `ranks` lists one by one.
struct EngineStats : RankStats {
  int num_waiting = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions = 0;
  int64_t steps = 0;
  // Tokens per engine step (all data-parallel ranks), vLLM's iteration_tokens_total: counts per
  // bucket of kIterationTokenBuckets (upper bounds; one more for larger), and their sum.
  std::vector<int64_t> iteration_tokens;
  int64_t iteration_tokens_sum = 0;
  // Speculative decoding: verification steps (one per speculating sequence and step), drafts
  // proposed and accepted, and per draft position (0-based) how many were accepted (vLLM's
  // spec_decode counters; acceptance length = 1 + accepted / verification steps).
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;
  std::vector<RankStats> ranks;
};

}  // namespace glms::engine

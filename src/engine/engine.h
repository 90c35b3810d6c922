// The serving engine: one thread runs step after step over a continuously changing batch per
// data-parallel rank (decodes first, then prefill chunks under a token budget), each rank with
// its paged latent cache shared through a radix prefix cache (scheduler.h), over the executor
// of the run's layout (runtime/executor.h). Requests come and go from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine_config.h"
#include "engine/request.h"
#include "model/glm5.h"
#include "model/step_runner.h"
#include "runtime/executor.h"

namespace glms::engine {

// Thrown by submit() when the waiting queue is full (the server answers 429).
struct QueueFull {};

class Engine {
 public:
  // On the CPU, over `model` (which must outlive the engine).
  Engine(const model::Glm5Model& model, EngineConfig config);
  // Over one runner (the CUDA one, say); the engine allocates its cache.
  Engine(std::unique_ptr<model::StepRunner> runner, EngineConfig config);
  // Over the executor of any layout: every data-parallel rank gets a cache of kv_cache_bytes
  // (or of the default) and the limits of `config`.
  Engine(std::unique_ptr<runtime::Executor> executor, EngineConfig config);
  ~Engine();  // stops the loop; unfinished requests get "abort"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const;
  const io::ModelConfig& model_config() const;
  const runtime::ParallelLayout& layout() const;
  int blocks_per_rank() const;  // each data-parallel rank's cache, in blocks of config().block_size

  // Queues a request; outputs arrive through `on_output` until one has finished = true.
  // Throws glms::Error for an invalid request (empty prompt, id outside the vocabulary, prompt +
  // max_tokens over max_model_len) and QueueFull when the waiting queue is full.
  uint64_t submit(RequestParams params, OutputCallback on_output);

  // Ends a request now (its blocks go back at once); it reports finish_reason "abort" unless it
  // already finished. Unknown ids are ignored.
  void cancel(uint64_t request_id);

  EngineStats stats() const;

  // vLLM's reset_prefix_cache and SGLang's flush_cache: empties every rank's prefix cache and
  // returns the blocks freed, or nothing while requests are queued or running (their blocks
  // would stay cached, and a flush is for a cold start).
  std::optional<int> reset_prefix_cache();

  // Stops taking requests and waits for every queued and running request to finish. With a
  // positive timeout, requests still unfinished then end with finish_reason "error", saying the
  // server shut down; returns whether everything finished by itself.
  bool drain(double timeout_seconds = 0.0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glms::engine

// The engine loop: each step ends cancelled and timed-out requests, asks the scheduler for the
// next step on every data-parallel rank, drafts with the MTP layer where speculation is on
// (drafter.h), runs the step on the executor with the lock released, and hands the results back
// to the scheduler (sampling, verification, reports). Outputs are delivered after the lock is
// released, so that a callback may call back into the engine (cancel on a stop string, submit
// the next request). The lock guards the queues and counters; the sequences being stepped
// belong to the engine thread.
#include "engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/drafter.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

namespace glms::engine {

namespace {

// Each rank's cache: the blocks kv_cache_bytes buys; without it, on a GPU what the memory budget
// leaves (the executor fits it), on the CPU enough for max_num_seqs x max_model_len up to 2 GiB.
int requested_blocks(const runtime::Executor& executor, const EngineConfig& config) {
  const int64_t bytes_per_token = executor.cache_bytes_per_token(config.kv_cache_dtype, config.speculative_steps > 0);
  const int64_t bytes_per_block = bytes_per_token * config.block_size;
  int64_t bytes = config.kv_cache_bytes;
  if (bytes <= 0 && executor.device() != "cpu") return 0;
  if (bytes <= 0) {
    const int64_t wanted = int64_t{config.max_num_seqs} * config.max_model_len * bytes_per_token;
    bytes = std::min<int64_t>(wanted, int64_t{2} << 30);
  }
  const int64_t blocks = bytes / bytes_per_block;
  if (blocks < (config.max_model_len + config.block_size - 1) / config.block_size)
    fail("the KV cache (" + std::to_string(bytes) + " bytes, " + std::to_string(blocks) +
         " blocks) cannot hold one sequence of max_model_len " + std::to_string(config.max_model_len) +
         " tokens: raise --kv-cache-memory or lower --max-model-len");
  return static_cast<int>(std::min<int64_t>(blocks, 1 << 24));
}

// Allocates every rank's cache and workspaces; returns the blocks each rank's cache has.
int allocate_caches(runtime::Executor& executor, const EngineConfig& config) {
  model::CacheShape shape;
  shape.block_size = config.block_size;
  shape.num_blocks = requested_blocks(executor, config);
  shape.gpu_memory_utilization = config.gpu_memory_utilization;
  shape.max_tokens = config.max_batch_tokens;
  shape.max_sequences = config.max_num_seqs;
  shape.max_context = config.max_model_len;
  shape.mtp = config.speculative_steps > 0;
  shape.cache_dtype = config.kv_cache_dtype;
  // Verifying K drafts asks for K + 1 logits rows per sequence.
  shape.max_logits = max_logits_rows(config);
  if (shape.mtp && !executor.has_mtp())
    fail("speculative decoding needs a checkpoint with an MTP layer (this " + executor.device() + " runner has none)");
  executor.allocate(shape);
  const int blocks = executor.num_blocks();
  const int one_sequence = (config.max_model_len + config.block_size - 1) / config.block_size;
  if (blocks < one_sequence)
    fail("the KV cache (" + std::to_string(blocks) + " blocks of " + std::to_string(config.block_size) +
         " tokens) cannot hold one sequence of max_model_len " + std::to_string(config.max_model_len) +
         " tokens: raise --gpu-memory-utilization or --kv-cache-memory, or lower --max-model-len");
  return blocks;
}

EngineConfig resolve(const runtime::Executor& executor, EngineConfig config) {
  if (config.max_model_len <= 0) config.max_model_len = executor.config().max_position_embeddings;
  // The CPU path is the reference: its masks stay in draw_token, on the host.
  if (executor.device() == "cpu") config.device_token_masks = false;
  if (config.max_num_seqs <= 0) fail("max_num_seqs must be positive");
  if (config.max_batch_tokens <= 0) fail("max_batch_tokens must be positive");
  if (config.block_size <= 0) fail("block_size must be positive");
  return config;
}

// Runs `work` with the lock released and takes it back however `work` ends.
template <typename Work>
auto unlocked(std::unique_lock<std::mutex>& lock, Work&& work) {
  struct Relock {
    std::unique_lock<std::mutex>& lock;
    ~Relock() { lock.lock(); }
  };
  lock.unlock();
  Relock relock{lock};
  return work();
}

}  // namespace

struct Engine::Impl {
  Impl(std::unique_ptr<runtime::Executor> executor, EngineConfig config);
  ~Impl();
  void loop();
  void step(std::unique_lock<std::mutex>& lock);
  void deliver(std::unique_lock<std::mutex>& lock);

  std::unique_ptr<runtime::Executor> executor;  // the model and its caches, on every rank
  EngineConfig config;
  int blocks_per_rank;
  Scheduler scheduler;

  mutable std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::vector<uint64_t> cancelled;
  std::vector<uint64_t> shut_down;  // ended by drain()'s deadline: they finish with an error
  uint64_t next_id = 1;
  bool stopping = false;
  bool draining = false;
  std::thread thread;
};

Engine::Impl::Impl(std::unique_ptr<runtime::Executor> e, EngineConfig c)
    : executor(std::move(e)),
      config(resolve(*executor, c)),
      blocks_per_rank(allocate_caches(*executor, config)),
      scheduler(config, executor->config(), executor->data_parallel_size(), blocks_per_rank) {
  thread = std::thread([this] { loop(); });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  thread.join();
}

void Engine::Impl::deliver(std::unique_lock<std::mutex>& lock) {
  std::vector<std::pair<OutputCallback, RequestOutput>> ready = scheduler.take_outbox();
  if (ready.empty()) return;
  lock.unlock();
  for (auto& [callback, output] : ready) {
    try {
      callback(output);
    } catch (...) {
      // A consumer's failure is its own: the engine and the other requests carry on.
    }
  }
  lock.lock();
}

void Engine::Impl::loop() {
  std::unique_lock lock(mutex);
  while (true) {
    wake.wait(lock, [this] { return stopping || !scheduler.idle() || !cancelled.empty() || !shut_down.empty(); });
    if (stopping) break;
    try {
      step(lock);
    } catch (const std::exception& e) {
      // An internal failure (e.g. out of memory) ends the requests in flight, not the server.
      scheduler.finish_running("error", std::string("internal error: ") + e.what());
    }
    deliver(lock);
    if (scheduler.idle()) idle.notify_all();
  }
  scheduler.finish_all("abort");
  deliver(lock);
  idle.notify_all();
}

void Engine::Impl::step(std::unique_lock<std::mutex>& lock) {
  scheduler.end_requests(cancelled, Clock::now());
  cancelled.clear();
  if (!shut_down.empty()) {
    scheduler.end_with_error(shut_down, "the server shut down before this request finished (--shutdown-timeout)");
    shut_down.clear();
  }
  StepPlan plan = scheduler.schedule();
  if (plan.empty()) return;

  std::vector<runtime::RankResult> results;
  std::string error;
  unlocked(lock, [&] {
    try {
      if (config.speculative_steps > 0) draft(*executor, config, plan);
      std::vector<runtime::RankStep> steps = scheduler.make_steps(plan);
      results = executor->forward(steps, config.speculative_steps > 0);  // hidden states feed the MTP entries
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  scheduler.postprocess(plan, results, error);
}

Engine::Engine(const model::Glm5Model& model, EngineConfig config)
    : Engine(model::make_cpu_runner(model), std::move(config)) {}

Engine::Engine(std::unique_ptr<model::StepRunner> runner, EngineConfig config)
    : Engine(runtime::make_local_executor(std::move(runner)), std::move(config)) {}

Engine::Engine(std::unique_ptr<runtime::Executor> executor, EngineConfig config)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(config))) {}

Engine::~Engine() = default;

const EngineConfig& Engine::config() const { return impl_->config; }
const io::ModelConfig& Engine::model_config() const { return impl_->executor->config(); }
const runtime::ParallelLayout& Engine::layout() const { return impl_->executor->layout(); }
int Engine::blocks_per_rank() const { return impl_->blocks_per_rank; }

uint64_t Engine::submit(RequestParams params, OutputCallback on_output) {
  const io::ModelConfig& mc = impl_->executor->config();
  const int max_len = impl_->config.max_model_len;
  if (params.prompt_ids.empty()) fail("the prompt is empty");
  for (int32_t id : params.prompt_ids)
    if (id < 0 || id >= mc.vocab_size)
      fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(mc.vocab_size) + ")");
  if (params.max_tokens < 1) fail("max_tokens must be at least 1");
  const int64_t total = static_cast<int64_t>(params.prompt_ids.size()) + params.max_tokens;
  if (total > max_len)
    fail("this model's maximum context length is " + std::to_string(max_len) + " tokens, but " +
         std::to_string(params.prompt_ids.size()) + " prompt tokens + " + std::to_string(params.max_tokens) +
         " max_tokens = " + std::to_string(total) + " were requested");
  if (params.top_logprobs > 20) fail("top_logprobs must be at most 20");

  auto seq = std::make_unique<Sequence>();
  seq->tokens = params.prompt_ids;
  seq->prompt_len = static_cast<int>(params.prompt_ids.size());
  seq->sampler = Sampler(params.sampling.seed);
  seq->speculates = impl_->config.speculative_steps > 0 && !adjusts_logits(params) && params.prompt_logprobs < 0;
  seq->params = std::move(params);
  seq->on_output = std::move(on_output);
  seq->arrival = Clock::now();
  uint64_t id;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->draining || impl_->stopping) fail("the engine is shutting down and takes no new requests");
    if (impl_->scheduler.num_waiting() >= impl_->config.max_waiting) throw QueueFull{};
    id = seq->id = impl_->next_id++;
    impl_->scheduler.add(std::move(seq));
  }
  impl_->wake.notify_all();
  return id;
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->cancelled.push_back(request_id);
  }
  impl_->wake.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->scheduler.stats();
}

std::optional<int> Engine::reset_prefix_cache() {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->scheduler.idle()) return std::nullopt;
  return impl_->scheduler.drop_cached_prefixes();
}

bool Engine::drain(double timeout_seconds) {
  std::unique_lock lock(impl_->mutex);
  impl_->draining = true;
  auto is_idle = [this] { return impl_->scheduler.idle(); };
  if (timeout_seconds <= 0) {
    impl_->idle.wait(lock, is_idle);
    return true;
  }
  if (impl_->idle.wait_for(lock, std::chrono::duration<double>(timeout_seconds), is_idle)) return true;
  for (uint64_t id : impl_->scheduler.request_ids()) impl_->shut_down.push_back(id);
  impl_->wake.notify_all();
  impl_->idle.wait(lock, is_idle);
  return false;
}

}  // namespace glms::engine

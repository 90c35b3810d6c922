#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/generate_steps.h"

namespace glms::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

namespace detail {

int64_t checked_total_positions(const io::ModelConfig& config, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options, int extra_positions) {
  if (prompt.empty()) fail("the prompt is empty: give at least one token");
  if (options.max_tokens < 0) fail("max_tokens must be >= 0");
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens + extra_positions;
  if (total > config.max_position_embeddings)
    fail("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" + std::to_string(options.max_tokens) +
         ")" + (extra_positions ? " + " + std::to_string(extra_positions) + " speculative positions" : std::string()) +
         " exceeds the model's " + std::to_string(config.max_position_embeddings) + " positions");
  return total;
}

std::vector<int32_t> allocate_private(model::StepRunner& runner, int64_t total_positions, const GenerateOptions& options) {
  model::CacheShape shape;
  shape.block_size = options.block_size;
  shape.num_blocks = static_cast<int>((total_positions + options.block_size - 1) / options.block_size);
  shape.max_tokens = std::max(1, options.prefill_chunk) + options.speculative_steps + 1;
  shape.max_sequences = 1;
  shape.max_logits = options.speculative_steps + 1;  // a verify step's rows
  shape.max_context = static_cast<int>(total_positions);
  shape.mtp = options.speculative_steps > 0;
  shape.cache_dtype = options.kv_cache_dtype;
  runner.allocate(shape);
  // A private cache maps logical blocks to physical ones one to one.
  std::vector<int32_t> table(shape.num_blocks);
  for (int b = 0; b < shape.num_blocks; ++b) table[b] = b;
  return table;
}

std::vector<float> prefill(model::StepRunner& runner, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& block_table, const GenerateOptions& options,
                           std::vector<float>* last_hidden) {
  std::vector<float> logits;
  const size_t chunk = static_cast<size_t>(std::max(1, options.prefill_chunk));
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t end = std::min(prompt.size(), start + chunk);
    model::ForwardBatch batch;
    batch.add_sequence(std::vector<int32_t>(prompt.begin() + start, prompt.begin() + end), static_cast<int>(start),
                       block_table, options.block_size, false);
    model::ForwardTrace trace;
    trace.record_layers = false;
    logits = runner.forward(batch, last_hidden ? &trace : nullptr);
    if (last_hidden) last_hidden->insert(last_hidden->end(), trace.last_hidden.begin(), trace.last_hidden.end());
  }
  return logits;
}

bool append_token(const io::ModelConfig& config, const GenerateOptions& options, int32_t token, GenerateResult& result) {
  result.output_ids.push_back(token);
  if (options.on_token) options.on_token(token);
  const bool eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                   config.eos_token_ids.end();
  if (eos && !options.ignore_eos) {
    result.finish_reason = "stop";
    return true;
  }
  if (static_cast<int>(result.output_ids.size()) >= options.max_tokens) {
    result.finish_reason = "length";
    return true;
  }
  return false;
}

}  // namespace detail

GenerateResult generate(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options) {
  if (options.speculative_steps > 0) return generate_speculative(model, prompt, options);
  const auto runner = model::make_cpu_runner(model);
  return generate(*runner, prompt, options);
}

GenerateResult generate(model::StepRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  const io::ModelConfig& config = runner.config();
  if (options.speculative_steps > 0) return generate_speculative(runner, prompt, options);
  const int64_t total = detail::checked_total_positions(config, prompt, options, 0);
  const int block_size = options.block_size;
  const std::vector<int32_t> block_table = detail::allocate_private(runner, total, options);

  GenerateResult result;
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  Sampler sampler(options.sampling.seed);
  const auto prefill_start = std::chrono::steady_clock::now();
  std::vector<float> logits = detail::prefill(runner, prompt, block_table, options);
  result.prefill_seconds = seconds_since(prefill_start);

  // Decode steps return the next token (an argmax or a draw made where the logits are), not the
  // vocabulary's logits.
  const auto decode_start = std::chrono::steady_clock::now();
  int position = static_cast<int>(prompt.size());
  int32_t token = sampler.sample(logits.data(), config.vocab_size, options.sampling);
  while (!detail::append_token(config, options, token, result)) {
    model::ForwardBatch batch;
    batch.add_sequence({token}, position++, block_table, block_size, false);
    token = runner.forward_selected(batch, {sampler.next_row_output(options.sampling)}, nullptr).token[0];
    ++result.decode_steps;
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace glms::engine

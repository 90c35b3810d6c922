#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace glms::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

GenerateResult generate(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options) {
  const io::ModelConfig& config = model.config();
  if (options.speculative_steps > 0) return generate_speculative(model, prompt, options);
  if (prompt.empty()) fail("the prompt is empty: give at least one token");
  if (options.max_tokens < 0) fail("max_tokens must be >= 0");
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (total > config.max_position_embeddings)
    fail("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" + std::to_string(options.max_tokens) +
         ") exceeds the model's " + std::to_string(config.max_position_embeddings) + " positions");
  const int block_size = options.block_size;
  const int num_blocks = static_cast<int>((total + block_size - 1) / block_size);
  kv::PagedLatentCache cache(model.cache_layout(block_size), num_blocks);
  std::vector<int32_t> block_table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) block_table[b] = b;  // a private cache: identity mapping

  GenerateResult result;
  if (options.max_tokens == 0) {
    result.finish_reason = "length";
    return result;
  }
  Sampler sampler(options.sampling.seed);
  const auto prefill_start = std::chrono::steady_clock::now();
  std::vector<float> logits;
  const int chunk = std::max(1, options.prefill_chunk);
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t end = std::min(prompt.size(), start + chunk);
    model::ForwardBatch batch;
    batch.add_sequence(std::vector<int32_t>(prompt.begin() + start, prompt.begin() + end), static_cast<int>(start),
                       block_table, block_size, false);
    logits = model.forward(batch, cache);
  }
  result.prefill_seconds = seconds_since(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  int position = static_cast<int>(prompt.size());
  while (true) {
    const int32_t token = sampler.sample(logits.data(), config.vocab_size, options.sampling);
    result.output_ids.push_back(token);
    if (options.on_token) options.on_token(token);
    const bool is_eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                        config.eos_token_ids.end();
    if (is_eos && !options.ignore_eos) { result.finish_reason = "stop"; break; }
    if (static_cast<int>(result.output_ids.size()) >= options.max_tokens) { result.finish_reason = "length"; break; }
    model::ForwardBatch batch;
    batch.add_sequence({token}, position++, block_table, block_size, false);
    logits = model.forward(batch, cache);
    ++result.decode_steps;
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace glms::engine

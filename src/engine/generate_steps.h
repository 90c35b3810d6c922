// The pieces that plain and speculative single-request generation share (internal to engine/).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/generator.h"

namespace glms::engine::detail {

// Checks the request (non-empty prompt, max_tokens >= 0, prompt + max_tokens + extra_positions
// within the model's positions) and returns the positions its private cache needs.
int64_t checked_total_positions(const io::ModelConfig& config, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options, int extra_positions);

// [0, 1, ..., count - 1]: a private cache maps logical blocks to physical ones one to one.
std::vector<int32_t> identity_block_table(int count);

// Runs the prompt in chunks of options.prefill_chunk and returns the last position's logits.
// With `last_hidden`, appends every prompt position's pre-norm hidden state [P, hidden].
std::vector<float> prefill(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                           kv::PagedLatentCache& cache, const std::vector<int32_t>& block_table,
                           const GenerateOptions& options, std::vector<float>* last_hidden = nullptr);

// Records a chosen token (and calls on_token); returns true, with finish_reason set, when the
// request ends with it (EOS unless ignored, or max_tokens reached).
bool append_token(const io::ModelConfig& config, const GenerateOptions& options, int32_t token, GenerateResult& result);

}  // namespace glms::engine::detail

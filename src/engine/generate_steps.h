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

// Allocates `runner` for one sequence of `total_positions` in a private cache; returns its
// block table.
std::vector<int32_t> allocate_private(model::StepRunner& runner, int64_t total_positions, const GenerateOptions& options);

// Runs the prompt in chunks of options.prefill_chunk and returns the last position's logits.
// With `last_hidden`, appends every prompt position's pre-norm hidden state [P, hidden].
std::vector<float> prefill(model::StepRunner& runner, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& block_table, const GenerateOptions& options,
                           std::vector<float>* last_hidden = nullptr);

// Records a chosen token (and calls on_token); returns true, with finish_reason set, when the
// request ends with it (EOS unless ignored, or max_tokens reached).
bool append_token(const io::ModelConfig& config, const GenerateOptions& options, int32_t token, GenerateResult& result);

}  // namespace glms::engine::detail

// MTP drafting for a step's speculative decodes (EngineConfig::speculative_steps): before the
// target forward, the draft layer runs over each speculating sequence's pending entries (the
// target's hidden states of the positions computed since its last run), then chains K drafts.
// Every data-parallel rank runs its MTP forwards in the same calls (a rank with nothing to draft
// runs empty batches), because the draft layer's MoE gathers all ranks' tokens.
#pragma once

#include "engine/engine_config.h"
#include "engine/scheduler.h"
#include "runtime/executor.h"

namespace glms::engine {

// Fills the plan's draft_tokens (and draft_probs for sampled requests); a decode with nothing to
// draft from (right after a prefix-cache hit) is reduced to a plain decode.
void draft(runtime::Executor& executor, const EngineConfig& config, StepPlan& plan);

}  // namespace glms::engine

// The tokens a constraint leaves open over a vocabulary of `vocab` ids (the structured tests).
#pragma once

#include <cmath>
#include <vector>

#include "engine/request.h"

namespace glms::testing {

inline std::vector<int> allowed_tokens(const engine::TokenConstraint& c, int vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
  c.mask(logits.data(), vocab);
  std::vector<int> out;
  for (int t = 0; t < vocab; ++t)
    if (std::isfinite(logits[t])) out.push_back(t);
  return out;
}

}  // namespace glms::testing

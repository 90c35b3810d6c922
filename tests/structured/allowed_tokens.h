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

namespace glms::testing {

// Whether `text` can be written token by token (one byte token each, from `byte_token`) with every
// token allowed when it is written, and the constraint may end after it.
template <class ByteToken>
bool writes_whole(engine::TokenConstraint& c, int vocab, const std::string& text, ByteToken byte_token) {
  for (const unsigned char ch : text) {
    const int t = byte_token(ch);
    if (t < 0) return false;
    std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
    c.mask(logits.data(), vocab);
    if (!std::isfinite(logits[static_cast<size_t>(t)])) return false;
    c.accept(t);
  }
  return c.may_end();
}

}  // namespace glms::testing

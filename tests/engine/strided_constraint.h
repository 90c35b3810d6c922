// A structured-output stand-in for the engine tests (no grammar needed): after k accepted tokens,
// the last one `last`, the tokens t >= 3 with (t + 5 k + last) % period == 0 may follow (one
// token in `period`, whatever k and last are), and the output may end once it has min_length
// tokens. It counts the tokens it accepted that it did not allow (EOS ids are allowed where it
// may end and EOS is not ignored), so a test can check that every draw respected the mask.
// allowed_bits is TokenConstraint's default (from mask()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "engine/request.h"

namespace glms::testing {

class StridedConstraint final : public engine::TokenConstraint {
 public:
  // eos_ids: the ids that may end the output (empty where the request ignores EOS).
  StridedConstraint(int period, int min_length, std::vector<int32_t> eos_ids)
      : period_(period), min_length_(min_length), eos_ids_(std::move(eos_ids)) {}

  bool allows(int32_t t) const {
    return t >= 3 && (t + int64_t{5} * accepted_ + last_) % period_ == 0;
  }
  void mask(float* logits, int vocab) const override {
    for (int t = 0; t < vocab; ++t)
      if (!allows(t)) logits[t] = -std::numeric_limits<float>::infinity();
  }
  bool may_end() const override { return accepted_ >= min_length_; }
  void accept(int32_t token) override {
    const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
    if (!allows(token) && !(eos && may_end())) ++violations_;
    ++accepted_;
    last_ = token;
  }
  int violations() const { return violations_; }
  int accepted() const { return accepted_; }

 private:
  int period_, min_length_;
  std::vector<int32_t> eos_ids_;
  int accepted_ = 0;
  int32_t last_ = 0;
  int violations_ = 0;
};

}  // namespace glms::testing

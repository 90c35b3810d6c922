// Grammars of decimal numbers within bounds, written digit by digit: JSON schema's minimum,
// maximum, exclusiveMinimum and exclusiveMaximum on integers and numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "structured/grammar.h"

namespace glms::structured {

inline constexpr int kMaxIntegerDigits = 16;  // digits of a number's integer part glmserve writes
inline constexpr int kMaxFractionDigits = 16;  // and of its fraction
inline constexpr int64_t kLargestInteger = 9999999999999999;  // 16 digits

// Non-negative integers in [lo, hi] written without leading zeros (0 <= lo <= hi).
Expr natural_range(int64_t lo, int64_t hi);

// A bound of a number as the decimal its JSON text means: sign, integer digits (no leading
// zeros), fraction digits (no trailing zeros), and whether the bound itself is excluded.
struct DecimalBound {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  bool exclusive = false;
};
// The bound of value `value` (its shortest decimal form, as std::to_chars writes it).
DecimalBound decimal_bound(double value, bool exclusive);

// JSON numbers x with lo <= x <= hi (either bound may be absent; exclusive ones strict), written
// without an exponent, with at most kMaxIntegerDigits integer and kMaxFractionDigits fraction
// digits; where the bounds have fraction digits, x is written with at least as many as the
// longest (integers bare too: integer_range). Nothing where no such x exists; fails (naming
// `path`) where a bound has more fraction digits than that.
std::optional<Expr> decimal_range(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi,
                                  const std::string& path);

// Integers in [lo, hi], written without leading zeros (|lo|, |hi| <= kLargestInteger).
Expr integer_range(int64_t lo, int64_t hi);

}  // namespace glms::structured

// Number checks for the subcommands' options that say in words what they expect: CLI11's
// PositiveNumber and NonNegativeNumber name a range up to the largest double (309 digits).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

namespace glms::cli {

// A finite number above 0 (`allow_zero`: or 0).
inline CLI::Validator number_at_least_zero(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v);
        if (number && (allow_zero ? v >= 0 : v > 0)) return "";
        return std::string("expects ") + (allow_zero ? "a number of 0 or more" : "a number above 0") + ", not '" +
               text + "'";
      },
      allow_zero ? "NUMBER >= 0" : "NUMBER > 0");
}
inline CLI::Validator positive_number() { return number_at_least_zero(false); }
inline CLI::Validator non_negative_number() { return number_at_least_zero(true); }

}  // namespace glms::cli

// Checks for the subcommands' options that say in words what they expect: numbers (CLI11's
// PositiveNumber and NonNegativeNumber name a range up to the largest double, 309 digits), and
// model paths that may be Hugging Face repo ids.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/hf_cache.h"

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

// A path as given where it exists; else a Hugging Face repo id, replaced by its snapshot folder in
// the hub cache (io/hf_cache.h), as vLLM takes `--model zai-org/GLM-5.2`. Use with transform().
inline CLI::Validator local_path_or_cached_repo() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (std::filesystem::exists(text)) return "";
        try {
          text = io::resolve_model(text, io::HubCacheEnvironment::from_environment()).folder.string();
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "PATH|REPO_ID");
}

}  // namespace glms::cli

// A compiled PCRE2 pattern (UTF + UCP, JIT when available) used by pre-tokenizers,
// normalizers and decoders. Immutable after construction and safe to share between threads:
// per-thread match state lives in thread-local storage.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace glms::text {

struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
};

class Regex {
 public:
  // Throws glms::Error with the PCRE2 message and offset when the pattern does not compile.
  explicit Regex(std::string_view pattern);
  // A pattern that matches `literal` exactly (all metacharacters escaped).
  static Regex literal(std::string_view literal);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // All non-empty, non-overlapping matches in `subject`, left to right, appended to `out`.
  // `subject` must be valid UTF-8 (it is not re-checked).
  void find_all(std::string_view subject, std::vector<ByteRange>& out) const;

  // Replaces every match with `replacement` (taken literally).
  std::string replace_all(std::string_view subject, std::string_view replacement) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace glms::text

// UTF-8 helpers shared by the tokenizer pieces. All functions work on raw bytes; none allocate
// unless they return a std::string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace glms::text::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Length in bytes of the well-formed UTF-8 sequence starting at s[pos], or 0 when the bytes
// there are not a complete well-formed sequence (bad lead, bad continuation, overlong,
// surrogate, above U+10FFFF, or truncated by the end of s).
size_t valid_sequence_length(std::string_view s, size_t pos);

// Byte offset of the first ill-formed byte, or std::string_view::npos when s is valid UTF-8.
size_t find_invalid(std::string_view s);

inline bool is_valid(std::string_view s) { return find_invalid(s) == std::string_view::npos; }

// Decodes the code point at s[pos] (s must be valid UTF-8 there) and advances pos past it.
char32_t decode_at(std::string_view s, size_t& pos);

void append(std::string& out, char32_t cp);

// Python's str.isspace() for one code point: ASCII whitespace, the separators \x1c-\x1f and the
// Unicode spaces (U+0085, U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000).
bool is_python_space(char32_t c);

// Lossy conversion: every maximal ill-formed subpart becomes one U+FFFD (the Unicode
// "substitution of maximal subparts" practice, which is also what Rust's from_utf8_lossy does).
std::string to_valid_lossy(std::string_view bytes);

// Number of bytes at the end of s that form a proper prefix of a well-formed sequence (a
// multi-byte character that is not finished yet); 0 when s ends on a character boundary or
// with bytes that can never become valid.
size_t incomplete_tail_length(std::string_view s);

}  // namespace glms::text::utf8

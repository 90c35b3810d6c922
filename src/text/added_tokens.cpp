#include "text/added_tokens.h"

#include <utf8proc.h>

#include "text/normalizer.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

char32_t char_before(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return utf8::decode_at(text, start);
}

}  // namespace

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  nodes_.emplace_back();
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    int32_t node = 0;
    for (char c : token.content) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].children.push_back({byte, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(tokens_.size());
    first_byte_[static_cast<unsigned char>(token.content[0])] = true;
    tokens_.push_back(token);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, next] : nodes_[static_cast<size_t>(node)].children) {
    if (b == byte) return next;
  }
  return -1;
}

std::vector<AddedTokenMatch> AddedTokenMatcher::find(std::string_view text) const {
  std::vector<AddedTokenMatch> matches;
  if (tokens_.empty()) return matches;
  size_t covered = 0;  // end of the last accepted match, whitespace included
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0;
    int32_t found = -1;
    size_t found_end = pos;
    for (size_t k = pos; k < text.size(); ++k) {
      node = child(node, static_cast<unsigned char>(text[k]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].token >= 0) {
        found = nodes_[static_cast<size_t>(node)].token;
        found_end = k + 1;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(found)];
    size_t begin = pos;
    size_t end = found_end;
    pos = found_end;
    if (begin < covered) continue;  // swallowed by the previous token's rstrip
    if (token.single_word) {
      size_t after = end;
      const bool word_before = begin > 0 && is_word_char(char_before(text, begin));
      const bool word_after = end < text.size() && is_word_char(utf8::decode_at(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (begin > covered) {
        const size_t char_start = [&] {
          size_t s = begin - 1;
          while (s > 0 && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
          return s;
        }();
        size_t next = char_start;
        if (!is_unicode_whitespace(utf8::decode_at(text, next))) break;
        begin = char_start;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!is_unicode_whitespace(utf8::decode_at(text, next))) break;
        end = next;
      }
    }
    matches.push_back({begin, end, token.id});
    covered = end;
  }
  return matches;
}

}  // namespace glms::text

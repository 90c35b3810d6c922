#include "text/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

// True when `cp` is left unchanged by `form` whatever surrounds it, judged conservatively:
// a starter (combining class 0, not a mark, not a Hangul jamo) without a decomposition that
// the form applies. Characters outside this set send the text through utf8proc.
bool is_inert(char32_t cp, UnicodeForm form) {
  const bool compose_canonical_only = form == UnicodeForm::NFC;
  if (cp < 0x80 || (compose_canonical_only && cp < 0x300)) return true;
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // conjoining jamo compose algorithmically
  if (cp >= 0xAC00 && cp <= 0xD7A3) return form == UnicodeForm::NFC || form == UnicodeForm::NFKC;  // syllables
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  if (p->combining_class != 0 || p->comp_exclusion) return false;
  if (p->category == UTF8PROC_CATEGORY_MN || p->category == UTF8PROC_CATEGORY_MC ||
      p->category == UTF8PROC_CATEGORY_ME) {
    return false;
  }
  if (p->decomp_seqindex != UINT16_MAX) return compose_canonical_only && p->decomp_type != 0;
  return true;
}

// utf8proc's form of `text`, appended to `out`.
void append_normalized(std::string_view text, UnicodeForm form, std::string& out) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case UnicodeForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case UnicodeForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UnicodeForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) throw Error(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
}

}  // namespace

bool is_unicode_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Nothing before an inert character can combine with anything after it, so the text is cut
// right before each inert character and only the pieces holding other characters go through
// utf8proc.
void UnicodeNormalizer::normalize(std::string& text) const {
  std::string out;
  size_t piece_start = 0;
  bool piece_inert = true;
  bool changed = false;
  auto close_piece = [&](size_t end) {
    const std::string_view piece = std::string_view(text).substr(piece_start, end - piece_start);
    if (piece_inert) {
      if (changed) out.append(piece);
      return;
    }
    if (!changed) {
      out.reserve(text.size() + 16);
      out.assign(text, 0, piece_start);
      changed = true;
    }
    append_normalized(piece, form_, out);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t char_start = pos;
    const bool inert = static_cast<unsigned char>(text[pos]) < 0x80 ? (++pos, true) : is_inert(utf8::decode_at(text, pos), form_);
    if (inert) {
      if (char_start > piece_start) close_piece(char_start);
      piece_start = char_start;
      piece_inert = true;
    } else {
      piece_inert = false;
    }
  }
  if (pos > piece_start) close_piece(pos);
  if (changed) text = std::move(out);
}

void LowercaseNormalizer::normalize(std::string& text) const {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = utf8::decode_at(text, pos);
    if (cp == 0x130) {  // the one letter whose full lowercase mapping is two characters
      out.append("i\xCC\x87");
      continue;
    }
    utf8::append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  text = std::move(out);
}

void StripAccentsNormalizer::normalize(std::string& text) const {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    const char32_t cp = utf8::decode_at(text, pos);
    if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_MN) continue;
    out.append(text, begin, pos - begin);
  }
  text = std::move(out);
}

void ReplaceNormalizer::normalize(std::string& text) const { text = pattern_.replace_all(text, content_); }

void PrependNormalizer::normalize(std::string& text) const {
  if (!text.empty()) text.insert(0, prefix_);
}

void StripNormalizer::normalize(std::string& text) const {
  size_t begin = 0;
  size_t end = text.size();
  if (left_) {
    while (begin < end) {
      size_t next = begin;
      if (!is_unicode_whitespace(utf8::decode_at(text, next))) break;
      begin = next;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t next = start;
      if (!is_unicode_whitespace(utf8::decode_at(text, next))) break;
      end = start;
    }
  }
  text = text.substr(begin, end - begin);
}

void SequenceNormalizer::normalize(std::string& text) const {
  for (const NormalizerPtr& step : steps_) step->normalize(text);
}

}  // namespace glms::text

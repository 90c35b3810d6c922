#include "text/utf8.h"

namespace glms::text::utf8 {
namespace {

// Accepted range of the second byte for a given lead byte (Unicode table 3-7), and the total
// sequence length; length 0 marks a byte that cannot start a sequence.
struct LeadInfo {
  uint8_t length;
  uint8_t second_lo;
  uint8_t second_hi;
};

constexpr LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the longest prefix of a sequence at s[pos] that is still well-formed (1..4), and
// whether it is complete.
size_t well_formed_prefix(std::string_view s, size_t pos, bool& complete) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  const LeadInfo info = lead_info(lead);
  complete = false;
  if (info.length == 0) return 0;
  if (info.length == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  while (n < info.length && pos + n < s.size()) {
    const auto b = static_cast<uint8_t>(s[pos + n]);
    const uint8_t lo = n == 1 ? info.second_lo : 0x80;
    const uint8_t hi = n == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return n;
    ++n;
  }
  complete = n == info.length;
  return n;
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = well_formed_prefix(s, pos, complete);
  return complete ? n : 0;
}

size_t find_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = valid_sequence_length(s, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

bool is_python_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

char32_t decode_at(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const auto cont = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[pos + i]) & 0x3F); };
  char32_t cp;
  if (b0 < 0xE0) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    pos += 2;
  } else if (b0 < 0xF0) {
    cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    pos += 3;
  } else {
    cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    pos += 4;
  }
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_valid_lossy(std::string_view bytes) {
  if (is_valid(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    const size_t n = well_formed_prefix(bytes, pos, complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out.append(kReplacementUtf8);
      pos += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t incomplete_tail_length(std::string_view s) {
  // A character is at most 4 bytes, so only a lead byte among the last 3 can be unfinished.
  const size_t first = s.size() >= 3 ? s.size() - 3 : 0;
  for (size_t pos = s.size(); pos-- > first;) {
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
    bool complete = false;
    const size_t n = well_formed_prefix(s, pos, complete);
    return (!complete && n > 0 && pos + n == s.size()) ? n : 0;
  }
  return 0;
}

}  // namespace glms::text::utf8

#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace glms::text {

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

// Match data, match context and JIT stack reused by every match on one thread.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Advances one UTF-8 character from pos (used after an empty match).
size_t next_char(std::string_view s, size_t pos) {
  ++pos;
  while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
  return pos;
}

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    throw Error("invalid regex /" + pattern_ + "/ at offset " + std::to_string(error_offset) + ": " +
                pcre2_message(error_code));
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view literal) {
  std::string quoted = "\\Q";
  size_t pos = 0;
  // \Q...\E quotes everything except a literal "\E", which is spliced in escaped.
  for (size_t hit; (hit = literal.find("\\E", pos)) != std::string_view::npos; pos = hit + 2) {
    quoted.append(literal.substr(pos, hit - pos));
    quoted.append("\\E\\\\E\\Q");
  }
  quoted.append(literal.substr(pos));
  quoted.append("\\E");
  return Regex(quoted);
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

void Regex::find_all(std::string_view subject, std::vector<ByteRange>& out) const {
  ThreadMatchState& state = thread_state();
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    const int rc = compiled_->jit
                       ? pcre2_jit_match(compiled_->code, text, subject.size(), start, 0, state.data, state.context)
                       : pcre2_match(compiled_->code, text, subject.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                                     state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw Error("regex /" + pattern_ + "/ failed to match: " + pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      out.push_back({begin, end});
      start = end;
    } else {
      if (begin >= subject.size()) return;
      start = next_char(subject, begin);
    }
  }
}

std::string Regex::replace_all(std::string_view subject, std::string_view replacement) const {
  std::vector<ByteRange> matches;
  find_all(subject, matches);
  if (matches.empty()) return std::string(subject);
  std::string out;
  out.reserve(subject.size());
  size_t prev = 0;
  for (const ByteRange& m : matches) {
    out.append(subject.substr(prev, m.begin - prev));
    out.append(replacement);
    prev = m.end;
  }
  out.append(subject.substr(prev));
  return out;
}

}  // namespace glms::text

#include "text/decoder.h"

#include "text/pre_tokenizer.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

// The byte a "<0xXX>" token stands for, or -1.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

void join_into_one(std::vector<std::string>& tokens) {
  if (tokens.size() == 1) return;
  std::string joined;
  for (const std::string& t : tokens) joined.append(t);
  tokens.assign(1, std::move(joined));
}

}  // namespace

void ByteLevelDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  std::string bytes;
  std::string token_bytes;
  for (const std::string& token : tokens) {
    token_bytes.clear();
    bool all_mapped = true;
    for (size_t pos = 0; pos < token.size();) {
      const size_t n = utf8::valid_sequence_length(token, pos);
      if (n == 0) {
        all_mapped = false;
        break;
      }
      size_t next = pos;
      const int b = alphabet.decode(utf8::decode_at(token, next));
      if (b < 0) {
        all_mapped = false;
        break;
      }
      token_bytes.push_back(static_cast<char>(b));
      pos = next;
    }
    bytes.append(all_mapped ? token_bytes : token);
  }
  tokens.assign(1, utf8::to_valid_lossy(bytes));
  context.fused = true;
}

void ByteFallbackDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  size_t run_tokens = 0;
  auto flush_run = [&] {
    if (run_tokens == 0) return;
    if (utf8::is_valid(run)) {
      out.push_back(run);
    } else {
      for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(utf8::kReplacementUtf8);
    }
    run.clear();
    run_tokens = 0;
  };
  for (std::string& token : tokens) {
    const int b = byte_token_value(token);
    if (b >= 0) {
      run.push_back(static_cast<char>(b));
      ++run_tokens;
    } else {
      flush_run();
      out.push_back(std::move(token));
    }
  }
  context.open_byte_run = run_tokens > 0;
  flush_run();
  tokens = std::move(out);
}

void FuseDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  join_into_one(tokens);
  context.fused = true;
}

void StripDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& token = tokens[i];
    std::vector<size_t> starts;  // byte offset of each character
    for (size_t pos = 0; pos < token.size();) {
      starts.push_back(pos);
      utf8::decode_at(token, pos);
    }
    const size_t count = starts.size();
    auto char_at = [&](size_t k) {
      size_t pos = starts[k];
      return utf8::decode_at(token, pos);
    };
    // A fused chain that continues a sequence does not begin a token: keep its start.
    const bool strip_start = !(context.fused && i == 0 && !context.at_sequence_start);
    size_t first = 0;
    while (strip_start && first < start_ && first < count && char_at(first) == content_) ++first;
    size_t last = count;
    while (count - last < stop_ && last > first && char_at(last - 1) == content_) --last;
    const size_t begin = first < count ? starts[first] : token.size();
    const size_t end = last < count ? starts[last] : token.size();
    token = token.substr(begin, end - begin);
  }
}

void ReplaceDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext&) const {
  for (std::string& token : tokens) token = pattern_.replace_all(token, content_);
}

void MetaspaceDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool drop = drop_in_first_ && i == 0 && context.at_sequence_start;
    std::string& token = tokens[i];
    std::string out;
    out.reserve(token.size());
    for (size_t pos = 0; pos < token.size();) {
      if (token.compare(pos, replacement_.size(), replacement_) == 0) {
        if (!drop) out.push_back(' ');
        pos += replacement_.size();
      } else {
        out.push_back(token[pos++]);
      }
    }
    token = std::move(out);
  }
}

void SequenceDecoder::decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const {
  for (const DecoderPtr& step : steps_) step->decode_chain(tokens, context);
}

}  // namespace glms::text

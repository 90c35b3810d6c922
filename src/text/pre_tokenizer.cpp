#include "text/pre_tokenizer.h"

#include "text/utf8.h"

namespace glms::text {
namespace {

struct Segment {
  ByteRange range;
  bool is_match;
};

// Cuts `piece` (at byte offset `base` in the text) into matched and unmatched segments that
// cover it entirely, then merges them as `behavior` says. Mirrors HF NormalizedString::split.
void split_piece(std::string_view piece, size_t base, const Regex& pattern, SplitBehavior behavior, bool invert,
                 std::vector<ByteRange>& matches, std::vector<Segment>& segments, std::vector<ByteRange>& out) {
  matches.clear();
  segments.clear();
  pattern.find_all(piece, matches);
  size_t prev = 0;
  for (const ByteRange& m : matches) {
    if (m.begin > prev) segments.push_back({{prev, m.begin}, invert});
    segments.push_back({m, !invert});
    prev = m.end;
  }
  if (prev < piece.size()) segments.push_back({{prev, piece.size()}, invert});

  const size_t first_out = out.size();
  auto emit = [&](ByteRange r) { out.push_back({base + r.begin, base + r.end}); };
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Segment& s : segments) {
        if (!s.is_match) emit(s.range);
      }
      break;
    case SplitBehavior::Isolated:
      for (const Segment& s : segments) emit(s.range);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && out.size() > first_out) {
          out.back().end = base + s.range.end;
        } else {
          emit(s.range);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      std::vector<ByteRange> reversed;
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.is_match && !previous_match && !reversed.empty()) {
          reversed.back().begin = s.range.begin;
        } else {
          reversed.push_back(s.range);
        }
        previous_match = s.is_match;
      }
      for (size_t i = reversed.size(); i-- > 0;) emit(reversed[i]);
      break;
    }
    case SplitBehavior::Contiguous: {
      bool previous_match = false;
      for (size_t i = 0; i < segments.size(); ++i) {
        const Segment& s = segments[i];
        if (i > 0 && s.is_match == previous_match) {
          out.back().end = base + s.range.end;
        } else {
          emit(s.range);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
}

void drop_empty(std::vector<ByteRange>& pieces) {
  std::erase_if(pieces, [](const ByteRange& r) { return r.end <= r.begin; });
}

}  // namespace

void SplitPreTokenizer::pre_tokenize(PreTokens& tokens, bool) const {
  thread_local std::vector<ByteRange> matches;
  thread_local std::vector<Segment> segments;
  std::vector<ByteRange> out;
  out.reserve(tokens.pieces.size() * 2);
  for (size_t i = 0; i < tokens.pieces.size(); ++i) {
    split_piece(tokens.piece(i), tokens.pieces[i].begin, pattern_, behavior_, invert_, matches, segments, out);
  }
  drop_empty(out);
  tokens.pieces = std::move(out);
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  decoded_.fill(-1);
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
    std::string encoded;
    utf8::append(encoded, cp);
    encoded_length_[b] = static_cast<uint8_t>(encoded.size());
    for (size_t i = 0; i < encoded.size(); ++i) encoded_[b][i] = encoded[i];
    decoded_[cp] = static_cast<int16_t>(b);
  }
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space) {
  if (use_regex) {
    regex_split_ = std::make_unique<SplitPreTokenizer>(Regex(kGpt2Pattern), SplitBehavior::Isolated, false);
  }
}

void ByteLevelPreTokenizer::pre_tokenize(PreTokens& tokens, bool at_text_start) const {
  if (add_prefix_space_) {
    PreTokens spaced;
    for (size_t i = 0; i < tokens.pieces.size(); ++i) {
      const std::string_view piece = tokens.piece(i);
      const size_t begin = spaced.text.size();
      if (piece.front() != ' ') spaced.text.push_back(' ');
      spaced.text.append(piece);
      spaced.pieces.push_back({begin, spaced.text.size()});
    }
    tokens = std::move(spaced);
  }
  if (regex_split_) regex_split_->pre_tokenize(tokens, at_text_start);

  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  std::string mapped(tokens.text.size() * 2, '\0');
  char* out = mapped.data();
  for (ByteRange& r : tokens.pieces) {
    char* const begin = out;
    for (size_t k = r.begin; k < r.end; ++k) {
      const std::string_view encoded = alphabet.encode(static_cast<uint8_t>(tokens.text[k]));
      out[0] = encoded[0];
      out[1] = encoded.size() > 1 ? encoded[1] : '\0';
      out += encoded.size();
    }
    r = {static_cast<size_t>(begin - mapped.data()), static_cast<size_t>(out - mapped.data())};
  }
  mapped.resize(static_cast<size_t>(out - mapped.data()));
  tokens.text = std::move(mapped);
}

MetaspacePreTokenizer::MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
    : replacement_(std::move(replacement)), scheme_(scheme) {
  if (split) {
    split_ = std::make_unique<SplitPreTokenizer>(Regex::literal(replacement_), SplitBehavior::MergedWithNext, false);
  }
}

void MetaspacePreTokenizer::pre_tokenize(PreTokens& tokens, bool at_text_start) const {
  PreTokens replaced;
  for (size_t i = 0; i < tokens.pieces.size(); ++i) {
    const std::string_view piece = tokens.piece(i);
    const size_t begin = replaced.text.size();
    const bool starts_with_replacement = piece.substr(0, replacement_.size()) == replacement_ ||
                                         piece.front() == ' ';
    const bool prepend = !starts_with_replacement &&
                         (scheme_ == PrependScheme::Always ||
                          (scheme_ == PrependScheme::First && at_text_start && tokens.pieces[i].begin == 0));
    if (prepend) replaced.text.append(replacement_);
    for (char c : piece) {
      if (c == ' ') {
        replaced.text.append(replacement_);
      } else {
        replaced.text.push_back(c);
      }
    }
    replaced.pieces.push_back({begin, replaced.text.size()});
  }
  tokens = std::move(replaced);
  if (split_) split_->pre_tokenize(tokens, at_text_start);
}

void SequencePreTokenizer::pre_tokenize(PreTokens& tokens, bool at_text_start) const {
  for (const PreTokenizerPtr& step : steps_) {
    if (tokens.pieces.empty()) return;
    step->pre_tokenize(tokens, at_text_start);
  }
}

}  // namespace glms::text

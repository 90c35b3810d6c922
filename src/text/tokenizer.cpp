#include "text/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace glms::text {
namespace detail {

void TokenizerImpl::index_added_tokens() {
  added_by_id.clear();
  added_by_content.clear();
  std::vector<AddedToken> raw;
  std::vector<AddedToken> normalized;
  size_t limit = model ? model->id_limit() : 0;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const AddedToken& token = added_tokens[i];
    added_by_id[token.id] = i;
    added_by_content[token.content] = token.id;
    limit = std::max(limit, static_cast<size_t>(token.id) + 1);
    if (!token.normalized) {
      raw.push_back(token);
    } else {
      AddedToken as_matched = token;
      if (normalizer) normalizer->normalize(as_matched.content);
      normalized.push_back(std::move(as_matched));
    }
  }
  raw_matcher = AddedTokenMatcher(raw);
  normalized_matcher = AddedTokenMatcher(normalized);
  vocab_size = limit;
  special.assign(limit, false);
  for (const AddedToken& token : added_tokens) {
    if (token.special) special[static_cast<size_t>(token.id)] = true;
  }
}

int32_t TokenizerImpl::token_to_id(std::string_view token) const {
  if (auto it = added_by_content.find(std::string(token)); it != added_by_content.end()) return it->second;
  return model->token_to_id(token);
}

const std::string* TokenizerImpl::id_to_token(int32_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added_tokens[it->second].content;
  return model->id_to_token(id);
}

}  // namespace detail

namespace {

using detail::TokenizerImpl;

// Pre-tokenizes one section of normalized text and runs the model on each piece.
void encode_pieces(const TokenizerImpl& impl, std::string_view section, bool at_text_start,
                   std::vector<int32_t>& ids) {
  if (section.empty()) return;
  thread_local PreTokens tokens;
  tokens.reset(section);
  if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(tokens, at_text_start);
  for (size_t i = 0; i < tokens.pieces.size(); ++i) impl.model->encode_word(tokens.piece(i), ids);
}

// Normalizes a stretch of text between raw added tokens, then extracts the normalized added
// tokens from it and encodes what is left.
void encode_section(const TokenizerImpl& impl, std::string_view section, bool at_text_start,
                    std::vector<int32_t>& ids) {
  std::string normalized;
  if (impl.normalizer) {
    normalized.assign(section);
    impl.normalizer->normalize(normalized);
    section = normalized;
  }
  if (impl.normalized_matcher.empty()) {
    encode_pieces(impl, section, at_text_start, ids);
    return;
  }
  size_t prev = 0;
  for (const AddedTokenMatch& m : impl.normalized_matcher.find(section)) {
    encode_pieces(impl, section.substr(prev, m.begin - prev), at_text_start && prev == 0, ids);
    ids.push_back(m.id);
    prev = m.end;
  }
  encode_pieces(impl, section.substr(prev), at_text_start && prev == 0, ids);
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& file_or_dir) {
  return Tokenizer(detail::load_tokenizer_json(file_or_dir));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
    throw Error("tokenizer: input text is not valid UTF-8 (ill-formed byte " + std::string(byte) + " at offset " +
                std::to_string(bad) + ")");
  }
  const TokenizerImpl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = impl.post_processor.prefix;
  size_t prev = 0;
  for (const AddedTokenMatch& m : impl.raw_matcher.find(text)) {
    encode_section(impl, text.substr(prev, m.begin - prev), prev == 0, ids);
    ids.push_back(m.id);
    prev = m.end;
  }
  encode_section(impl, text.substr(prev), prev == 0, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl.post_processor.suffix.begin(), impl.post_processor.suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  bool open_byte_run = false;
  return decode_window(ids, true, skip_special_tokens, open_byte_run);
}

std::string Tokenizer::decode_window(std::span<const int32_t> ids, bool at_sequence_start, bool skip_special_tokens,
                                     bool& open_byte_run) const {
  const TokenizerImpl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    if (const std::string* token = impl.id_to_token(id)) tokens.push_back(*token);
  }
  open_byte_run = false;
  std::string text;
  if (!impl.decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 || !at_sequence_start) text.push_back(' ');
      text.append(tokens[i]);
    }
    return text;
  }
  DecodeContext context;
  context.at_sequence_start = at_sequence_start;
  impl.decoder->decode_chain(tokens, context);
  open_byte_run = context.open_byte_run;
  for (const std::string& t : tokens) text.append(t);
  return text;
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->id_to_token(id);
  return token ? *token : std::string();
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

size_t Tokenizer::min_tokens_for_bytes(size_t bytes) const {
  std::call_once(impl_->longest_token_once, [this] {
    size_t longest = 1;
    for (size_t id = 0; id < impl_->vocab_size; ++id) {
      const int32_t one = static_cast<int32_t>(id);
      longest = std::max(longest, decode(std::span<const int32_t>(&one, 1), false).size());
    }
    impl_->longest_token_bytes = longest;
  });
  const size_t per_token = impl_->longest_token_bytes * (impl_->normalizer ? 4 : 1);
  return (bytes + per_token - 1) / per_token;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[static_cast<size_t>(id)];
}

int32_t Tokenizer::bos_token_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_token_id() const { return impl_->eos_id; }
const std::filesystem::path& Tokenizer::source() const { return impl_->source; }

}  // namespace glms::text

// The vocabulary as structured outputs see it: each token's text as bytes, and a prefix trie over
// those texts so that a constraint's mask is one walk of the trie (shared prefixes are fed once,
// and a subtree is skipped as soon as its prefix is refused) instead of one walk per token.
//
// Markup tokens (GLM's <tool_call>, <arg_key>, ...) are special tokens with no text; a constraint
// that must produce them (tool calls) sees each as one reserved byte, 0xF8 + its index in
// kMarkupTokens. Those bytes never occur in UTF-8, so no text token and no text class can match
// them: a JSON string may not smuggle a <tool_call> in.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace glms::structured {

inline constexpr std::array<std::string_view, 8> kMarkupTokens = {
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>", "</think>"};
inline constexpr unsigned char kFirstMarkupByte = 0xF8;

// The reserved byte that stands for markup token `tag` (one of kMarkupTokens) in a constraint.
char markup_byte(std::string_view tag);

struct TokenVocabulary {
  std::vector<std::string> texts;  // [vocab] each token's bytes; empty: never allowed (special tokens)
  // The trie, flattened: node 0 is the root; a node's children are edges
  // [first_edge, first_edge + edge_count), sorted by byte; tokens whose text ends at a node are
  // token_ids[first_token, first_token + token_count).
  struct Node {
    int32_t first_edge = 0, edge_count = 0;
    int32_t first_token = 0, token_count = 0;
  };
  struct Edge {
    unsigned char byte;
    int32_t child;
  };
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::vector<int32_t> token_ids;
  int32_t vocab_size() const { return static_cast<int32_t>(texts.size()); }
};

using TokenTexts = std::shared_ptr<const TokenVocabulary>;

// Builds the trie over `texts`. `markup_ids[i]` is the id of kMarkupTokens[i] in this vocabulary,
// or -1 where it has none; those ids get their reserved byte as text.
TokenTexts make_vocabulary(std::vector<std::string> texts, const std::vector<int32_t>& markup_ids = {});

}  // namespace glms::structured

#include "structured/vocabulary.h"

#include <algorithm>

#include "core/error.h"

namespace glms::structured {

char markup_byte(std::string_view tag) {
  for (size_t i = 0; i < kMarkupTokens.size(); ++i)
    if (kMarkupTokens[i] == tag) return static_cast<char>(kFirstMarkupByte + i);
  fail("structured: '" + std::string(tag) + "' is not a markup token");
}

TokenTexts make_vocabulary(std::vector<std::string> texts, const std::vector<int32_t>& markup_ids) {
  auto vocab = std::make_shared<TokenVocabulary>();
  vocab->texts = std::move(texts);
  for (size_t i = 0; i < markup_ids.size() && i < kMarkupTokens.size(); ++i) {
    const int32_t id = markup_ids[i];
    if (id >= 0 && id < vocab->vocab_size())
      vocab->texts[static_cast<size_t>(id)] = std::string(1, static_cast<char>(kFirstMarkupByte + i));
  }
  // Tokens in byte order: then each token's path shares its longest common prefix with the one
  // before it, and the trie is built with one path stack, no per-node maps.
  std::vector<int32_t> sorted;
  for (int32_t id = 0; id < vocab->vocab_size(); ++id)
    if (!vocab->texts[static_cast<size_t>(id)].empty()) sorted.push_back(id);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return vocab->texts[static_cast<size_t>(a)] < vocab->texts[static_cast<size_t>(b)];
  });
  struct RawEdge {
    int32_t parent, child;
    unsigned char byte;
  };
  std::vector<RawEdge> raw_edges;
  std::vector<std::vector<int32_t>> tokens_at(1);
  std::vector<int32_t> path{0};  // path[d]: the node after d bytes of the previous token
  std::string previous;
  for (const int32_t id : sorted) {
    const std::string& text = vocab->texts[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < previous.size() && common < text.size() && previous[common] == text[common]) ++common;
    path.resize(common + 1);
    for (size_t d = common; d < text.size(); ++d) {
      const int32_t child = static_cast<int32_t>(tokens_at.size());
      tokens_at.emplace_back();
      raw_edges.push_back({path.back(), child, static_cast<unsigned char>(text[d])});
      path.push_back(child);
    }
    tokens_at[static_cast<size_t>(path.back())].push_back(id);
    previous = text;
  }
  // Edges were made in byte order within each parent: a stable sort by parent makes each node's
  // children contiguous.
  std::stable_sort(raw_edges.begin(), raw_edges.end(),
                   [](const RawEdge& a, const RawEdge& b) { return a.parent < b.parent; });
  vocab->nodes.resize(tokens_at.size());
  vocab->edges.reserve(raw_edges.size());
  for (const RawEdge& e : raw_edges) {
    TokenVocabulary::Node& n = vocab->nodes[static_cast<size_t>(e.parent)];
    if (n.edge_count == 0) n.first_edge = static_cast<int32_t>(vocab->edges.size());
    ++n.edge_count;
    vocab->edges.push_back({e.byte, e.child});
  }
  for (size_t i = 0; i < tokens_at.size(); ++i) {
    TokenVocabulary::Node& n = vocab->nodes[i];
    n.first_token = static_cast<int32_t>(vocab->token_ids.size());
    n.token_count = static_cast<int32_t>(tokens_at[i].size());
    vocab->token_ids.insert(vocab->token_ids.end(), tokens_at[i].begin(), tokens_at[i].end());
  }
  return vocab;
}

}  // namespace glms::structured

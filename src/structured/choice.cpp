#include "structured/choice.h"

#include <limits>
#include <map>

#include "core/error.h"

namespace glms::structured {

namespace {

// The choices' prefix trie: node 0 the root; `complete` where a choice ends.
struct Trie {
  struct Node {
    std::map<unsigned char, int> next;
    bool complete = false;
  };
  std::vector<Node> nodes{Node{}};

  void insert(const std::string& text) {
    int at = 0;
    for (const unsigned char c : text) {
      auto it = nodes[at].next.find(c);
      if (it == nodes[at].next.end()) {
        nodes.push_back(Node{});
        it = nodes[at].next.emplace(c, static_cast<int>(nodes.size()) - 1).first;
      }
      at = it->second;
    }
    nodes[at].complete = true;
  }
  // The node `text` leads to from `from`, or -1 when it leaves the trie.
  int walk(int from, const std::string& text) const {
    int at = from;
    for (const unsigned char c : text) {
      const auto it = nodes[at].next.find(c);
      if (it == nodes[at].next.end()) return -1;
      at = it->second;
    }
    return at;
  }
};

class ChoiceConstraint final : public engine::TokenConstraint {
 public:
  ChoiceConstraint(std::shared_ptr<const Trie> trie, TokenTexts texts) : trie_(std::move(trie)), texts_(std::move(texts)) {}

  void mask(float* logits, int vocab) const override {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    const std::vector<std::string>& texts = *texts_;
    int allowed_count = 0;
    for (int t = 0; t < vocab; ++t) {
      const bool allowed =
          at_ >= 0 && t < static_cast<int>(texts.size()) && !texts[t].empty() && trie_->walk(at_, texts[t]) >= 0;
      if (!allowed) logits[t] = kNever;
      allowed_count += allowed;
    }
    // No whole token continues the output (a choice whose next character only byte tokens
    // spell): it ends here rather than drawing from nothing.
    stuck_ = allowed_count == 0;
  }
  bool may_end() const override { return stuck_ || (at_ >= 0 && trie_->nodes[at_].complete); }
  void accept(int32_t token) override {
    const std::vector<std::string>& texts = *texts_;
    // An EOS (or any token outside the trie) ends the walk: nothing may follow it.
    at_ = at_ >= 0 && token >= 0 && token < static_cast<int32_t>(texts.size()) && !texts[token].empty()
              ? trie_->walk(at_, texts[token])
              : -1;
  }

 private:
  std::shared_ptr<const Trie> trie_;
  TokenTexts texts_;
  int at_ = 0;  // the trie node of the output so far
  mutable bool stuck_ = false;
};

}  // namespace

std::shared_ptr<engine::TokenConstraint> make_choice_constraint(const std::vector<std::string>& choices,
                                                                TokenTexts texts) {
  if (choices.empty()) fail("choice: give at least one string");
  auto trie = std::make_shared<Trie>();
  for (const std::string& c : choices) {
    if (c.empty()) fail("choice: the strings must not be empty");
    trie->insert(c);
  }
  return std::make_shared<ChoiceConstraint>(std::move(trie), std::move(texts));
}

}  // namespace glms::structured

#include "structured/recognizer.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace glms::structured {

namespace {

uint64_t hash_tops(const std::vector<int32_t>& tops, bool accepting) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(accepting);
  for (const int32_t t : tops) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return h;
}

}  // namespace

Recognizer::Recognizer(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  std::vector<int32_t> tops;
  bool accepting = false;
  expanded_.clear();
  for (const int32_t alt : grammar_->alternatives[static_cast<size_t>(grammar_->root)])
    expand(alt, -1, tops, accepting, 0);
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  start_ = tops.empty() && !accepting ? kDead : intern(std::move(tops), accepting);
}

int32_t Recognizer::node(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  const auto [it, added] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

void Recognizer::expand(int32_t pos, int32_t parent, std::vector<int32_t>& tops, bool& accepting, int depth) {
  // Left recursion is refused when the grammar is built, so expansion ends; the depth bound
  // only guards against grammars whose call chains are absurdly long.
  ++work_;
  if (depth > 4096 || tops.size() > kMaxTops) return;
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  if (!expanded_.insert(key).second) return;
  const Grammar::Element& el = grammar_->elements[static_cast<size_t>(pos)];
  switch (el.kind) {
    case Grammar::Element::Kind::kEnd:
      if (parent < 0) {
        accepting = true;
      } else {
        const Node back = nodes_[static_cast<size_t>(parent)];
        expand(back.pos, back.parent, tops, accepting, depth + 1);
      }
      return;
    case Grammar::Element::Kind::kBytes:
      tops.push_back(node(pos, parent));
      return;
    case Grammar::Element::Kind::kRule: {
      const int32_t back = pos + 1;
      // A call in tail position returns straight to our own return point.
      const int32_t callee_parent =
          grammar_->elements[static_cast<size_t>(back)].kind == Grammar::Element::Kind::kEnd ? parent : node(back, parent);
      for (const int32_t alt : grammar_->alternatives[static_cast<size_t>(el.value)])
        expand(alt, callee_parent, tops, accepting, depth + 1);
      return;
    }
  }
}

int32_t Recognizer::intern(std::vector<int32_t> tops, bool accepting) {
  const uint64_t h = hash_tops(tops, accepting);
  std::vector<int32_t>& candidates = state_ids_[h];
  for (const int32_t id : candidates) {
    const State& s = states_[static_cast<size_t>(id)];
    if (s.accepting == accepting && s.tops == tops) return id;
  }
  if (states_.size() >= kMaxStates || tops.size() > kMaxTops) return kDead;
  State s;
  s.tops = std::move(tops);
  s.accepting = accepting;
  states_.push_back(std::move(s));
  candidates.push_back(static_cast<int32_t>(states_.size()) - 1);
  return candidates.back();
}

int32_t Recognizer::step(int32_t state, unsigned char byte) {
  if (state < 0) return kDead;
  {
    State& s = states_[static_cast<size_t>(state)];
    if (!s.next) {
      s.next = std::make_unique<std::array<int32_t, 256>>();
      s.next->fill(kUnknown);
    }
    if ((*s.next)[byte] != kUnknown) return (*s.next)[byte];
  }
  const std::vector<int32_t> from = states_[static_cast<size_t>(state)].tops;  // intern() may move states_
  std::vector<int32_t> tops;
  bool accepting = false;
  expanded_.clear();
  for (const int32_t top : from) {
    const Node n = nodes_[static_cast<size_t>(top)];
    const Grammar::Element& el = grammar_->elements[static_cast<size_t>(n.pos)];
    if (grammar_->sets[static_cast<size_t>(el.value)].test(byte)) expand(n.pos + 1, n.parent, tops, accepting, 0);
  }
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  const int32_t next = tops.empty() && !accepting ? kDead : intern(std::move(tops), accepting);
  (*states_[static_cast<size_t>(state)].next)[byte] = next;
  return next;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, TokenTexts vocabulary)
    : grammar_(grammar), recognizer_(std::move(grammar)), vocabulary_(std::move(vocabulary)), start_(recognizer_.start()) {}

int32_t GrammarMatcher::advance(int32_t state, int32_t token, uint64_t* work) {
  if (token < 0 || token >= vocabulary_->vocab_size()) return Recognizer::kDead;
  const std::string& text = vocabulary_->texts[static_cast<size_t>(token)];
  if (text.empty()) return Recognizer::kDead;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t before = recognizer_.work();
  for (const unsigned char c : text) state = recognizer_.step(state, c);
  if (work) *work += recognizer_.work() - before;
  return state;
}

bool GrammarMatcher::accepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mutex_);
  return recognizer_.accepting(state);
}

bool GrammarMatcher::full() {
  std::lock_guard<std::mutex> lock(mutex_);
  return recognizer_.num_states() >= Recognizer::kMaxStates || masks_dropped_ >= 4;
}

size_t GrammarMatcher::num_states() {
  std::lock_guard<std::mutex> lock(mutex_);
  return recognizer_.num_states();
}

int GrammarMatcher::mask(int32_t state, float* logits, int vocab, uint64_t* work) {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t before = recognizer_.work();
  const Mask& m = allowed_tokens(state);
  if (work) *work += recognizer_.work() - before;
  const int known = std::min(vocab, vocabulary_->vocab_size());
  if (!m.dense) {
    thread_local std::vector<float> kept;
    kept.clear();
    for (const int32_t t : m.ids) kept.push_back(t < vocab ? logits[t] : 0.0f);
    std::fill(logits, logits + vocab, kNever);
    for (size_t i = 0; i < m.ids.size(); ++i)
      if (m.ids[i] < vocab) logits[m.ids[i]] = kept[i];
    return m.count;
  }
  // Dense: most tokens are allowed, so visit the refused ones (the zero bits) word by word.
  for (int word = 0; word * 64 < known; ++word) {
    const int base = word * 64;
    uint64_t refused = ~m.bits[static_cast<size_t>(word)];
    if (known - base < 64) refused &= (uint64_t{1} << (known - base)) - 1;
    for (; refused; refused &= refused - 1) logits[base + __builtin_ctzll(refused)] = kNever;
  }
  std::fill(logits + known, logits + std::max(known, vocab), kNever);
  return m.count;
}

int GrammarMatcher::allowed_bits(int32_t state, uint32_t* words, int vocab, uint64_t* work) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t before = recognizer_.work();
  const Mask& m = allowed_tokens(state);
  if (work) *work += recognizer_.work() - before;
  const int known = std::min(vocab, vocabulary_->vocab_size());
  const int num_words = (vocab + 31) / 32;
  std::fill(words, words + num_words, 0u);
  if (!m.dense) {
    for (const int32_t t : m.ids)
      if (t < known) words[t / 32] |= uint32_t{1} << (t % 32);
    return m.count;
  }
  // Dense: each cached 64-bit word is two of ours (low half first), the last one cut at `known`.
  for (int word = 0; word * 64 < known; ++word) {
    uint64_t bits = m.bits[static_cast<size_t>(word)];
    if (known - word * 64 < 64) bits &= (uint64_t{1} << (known - word * 64)) - 1;
    words[2 * word] = static_cast<uint32_t>(bits);
    if (2 * word + 1 < num_words) words[2 * word + 1] = static_cast<uint32_t>(bits >> 32);
  }
  return m.count;
}

const GrammarMatcher::Mask& GrammarMatcher::allowed_tokens(int32_t state) {
  const auto cached = masks_.find(state);
  if (cached != masks_.end()) return cached->second;
  const size_t words = (static_cast<size_t>(vocabulary_->vocab_size()) + 63) / 64;
  if (mask_bytes_ + words * 8 > kMaxMaskBytes) {
    masks_.clear();
    mask_bytes_ = 0;
    ++masks_dropped_;
  }
  Mask& m = masks_[state];
  m.bits.assign(words, 0);
  if (state >= 0) walk_trie(state, m.bits);
  for (const uint64_t w : m.bits) m.count += __builtin_popcountll(w);
  if (m.count < vocabulary_->vocab_size() / 32) {  // few allowed: keep their ids (smaller, faster to apply)
    m.dense = false;
    for (size_t w = 0; w < words; ++w)
      for (uint64_t bits = m.bits[w]; bits; bits &= bits - 1)
        m.ids.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
    std::vector<uint64_t>().swap(m.bits);
  }
  mask_bytes_ += m.dense ? words * 8 : m.ids.size() * 4 + 64;
  return m;
}

// Depth-first over the trie: a child is entered only when its byte keeps a state alive, and the
// tokens ending there are allowed.
void GrammarMatcher::walk_trie(int32_t state, std::vector<uint64_t>& bits) {
  struct Frame {
    int32_t node, state, edge;
  };
  std::vector<Frame> stack{{0, state, 0}};
  const TokenVocabulary& v = *vocabulary_;
  while (!stack.empty()) {
    Frame& f = stack.back();
    const TokenVocabulary::Node& n = v.nodes[static_cast<size_t>(f.node)];
    if (f.edge == n.edge_count) {
      stack.pop_back();
      continue;
    }
    const TokenVocabulary::Edge& e = v.edges[static_cast<size_t>(n.first_edge + f.edge++)];
    const int32_t next = recognizer_.step(f.state, e.byte);
    if (next == Recognizer::kDead) continue;
    const TokenVocabulary::Node& child = v.nodes[static_cast<size_t>(e.child)];
    for (int32_t i = 0; i < child.token_count; ++i) {
      const int32_t id = v.token_ids[static_cast<size_t>(child.first_token + i)];
      bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    if (child.edge_count > 0) stack.push_back({e.child, next, 0});
  }
}

namespace {

class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<GrammarMatcher> matcher, uint64_t max_work)
      : matcher_(std::move(matcher)), state_(matcher_->start()), max_work_(max_work) {}

  void mask(float* logits, int vocab) const override {
    // No whole token continues the output (the next byte is one only a byte-fallback token
    // spells, or a size limit was reached): it ends here rather than drawing from nothing.
    // Past the work bound nothing is allowed and nothing more is built.
    if (spent()) {
      std::fill(logits, logits + vocab, -std::numeric_limits<float>::infinity());
      stuck_ = true;
      return;
    }
    stuck_ = matcher_->mask(state_, logits, vocab, &work_) == 0;
  }
  void allowed_bits(uint32_t* words, int vocab) const override {
    if (spent()) {
      std::fill(words, words + mask_words(vocab), 0u);
      stuck_ = true;
      return;
    }
    stuck_ = matcher_->allowed_bits(state_, words, vocab, &work_) == 0;  // as mask()
  }
  bool may_end() const override { return stuck_ || matcher_->accepting(state_); }
  // An EOS or anything outside the text leaves the dead state: nothing may follow it.
  void accept(int32_t token) override {
    if (!spent()) state_ = matcher_->advance(state_, token, &work_);
  }
  std::string failure() const override {
    if (!spent()) return {};
    return "the grammar costs too much to follow: " + std::to_string(work_) +
           " parser stack expansions so far, over the bound of " + std::to_string(max_work_) +
           " a request; it keeps too many parses alive at once (for example a repeated optional item that can "
           "match any text): make the repetitions bounded or unambiguous";
  }

 private:
  bool spent() const { return work_ > max_work_; }

  std::shared_ptr<GrammarMatcher> matcher_;
  int32_t state_;
  uint64_t max_work_;
  mutable bool stuck_ = false;
  mutable uint64_t work_ = 0;  // recogniser work done for this request
};

}  // namespace

std::shared_ptr<engine::TokenConstraint> make_grammar_constraint(std::shared_ptr<GrammarMatcher> matcher,
                                                                 uint64_t max_work) {
  GLMS_CHECK(matcher != nullptr, "make_grammar_constraint needs a matcher");
  return std::make_shared<GrammarConstraint>(std::move(matcher), max_work);
}

std::shared_ptr<engine::TokenConstraint> make_grammar_constraint(std::shared_ptr<const Grammar> grammar,
                                                                 TokenTexts vocabulary, uint64_t max_work) {
  GLMS_CHECK(grammar && vocabulary, "make_grammar_constraint needs a grammar and a vocabulary");
  return make_grammar_constraint(std::make_shared<GrammarMatcher>(std::move(grammar), std::move(vocabulary)),
                                 max_work);
}

}  // namespace glms::structured

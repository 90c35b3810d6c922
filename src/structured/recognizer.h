// Following a grammar (grammar.h) byte by byte, and the token constraint built on it.
//
// The recogniser is a pushdown automaton kept as a set of stacks: each stack is a chain of
// interned nodes (a grammar position and the node to return to), its top always at a byte
// element. A byte advances every stack whose top accepts it, then expands calls and returns
// until each new top is at a byte element again. Calls in tail position push nothing, so
// right-recursive repetition runs in constant stack depth and its states repeat exactly.
//
// Sets of stacks are interned as states of a lazily built DFA with a 256-way transition row
// each, so a byte the state has seen before costs one lookup. The mask for the next token is one
// walk of the vocabulary's trie over those transitions; masks are cached per state (a JSON
// string's interior is one state however long the string grows), and shared by the requests
// that use the same grammar (GrammarMatcher).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/request.h"
#include "structured/grammar.h"
#include "structured/vocabulary.h"

namespace glms::structured {

class Recognizer {
 public:
  static constexpr int32_t kDead = -1;

  explicit Recognizer(std::shared_ptr<const Grammar> grammar);

  int32_t start() const { return start_; }
  // The state after `byte` from `state` (kDead when no stack accepts it). Past the size limits
  // (kMaxStates DFA states, kMaxTops stacks in one state) every new state is kDead.
  int32_t step(int32_t state, unsigned char byte);
  bool accepting(int32_t state) const { return state >= 0 && states_[static_cast<size_t>(state)].accepting; }
  size_t num_states() const { return states_.size(); }
  // Stack expansions done so far in building states: what following the grammar has cost.
  uint64_t work() const { return work_; }

  static constexpr size_t kMaxStates = 1 << 13;
  static constexpr size_t kMaxTops = 4096;

 private:
  struct Node {
    int32_t pos;     // a byte element (a top) or a return point (an inner node)
    int32_t parent;  // the node to return to, -1: the root rule
  };
  struct State {
    std::vector<int32_t> tops;  // sorted node ids
    bool accepting = false;     // the root rule may end here
    std::unique_ptr<std::array<int32_t, 256>> next;  // kUnknown until computed
  };
  static constexpr int32_t kUnknown = -2;

  int32_t node(int32_t pos, int32_t parent);
  // Adds the tops reached from grammar position `pos` returning to `parent`, once per (pos,
  // parent) in the closure being computed (expanded_): what it adds depends on nothing else, and
  // empty alternatives reaching the same point would otherwise multiply the paths (a rule of two
  // empty alternatives repeated 381 times: 2^381 of them).
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& tops, bool& accepting, int depth);
  int32_t intern(std::vector<int32_t> tops, bool accepting);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::unordered_set<uint64_t> expanded_;  // (pos, parent) of the closure being computed
  std::vector<State> states_;
  std::unordered_map<uint64_t, std::vector<int32_t>> state_ids_;  // hash of tops -> candidate states
  int32_t start_ = kDead;
  uint64_t work_ = 0;
};

// The recogniser and the masks of one grammar over one vocabulary, shared by every constraint
// made from it (all requests with the same schema): the DFA states and masks one request builds
// serve the next. Thread-safe (one lock per call). It stops growing at Recognizer::kMaxStates
// states, or when its mask cache had to be emptied 4 times; full() then says to start a fresh
// one for new requests.
// Each call that may build states adds the recogniser work it did to `*work` where given, so
// that a constraint can bound what one request spends (GrammarConstraint::kMaxWork).
class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, TokenTexts vocabulary);

  int32_t start() const { return start_; }
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  int32_t advance(int32_t state, int32_t token, uint64_t* work = nullptr);  // kDead for EOS, specials, misses
  bool accepting(int32_t state);
  // Sets logits[t] = -inf for every token t of [0, vocab) that may not follow `state`; returns
  // how many may.
  int mask(int32_t state, float* logits, int vocab, uint64_t* work = nullptr);
  // The same tokens as bits from the same cached mask: words[(vocab + 31) / 32], bit t % 32 of
  // word t / 32 set where token t may follow `state` (bits past vocab, and tokens past the
  // matcher's vocabulary, clear); returns what mask() returns.
  int allowed_bits(int32_t state, uint32_t* words, int vocab, uint64_t* work = nullptr);
  bool full();
  size_t num_states();

  // Cached masks are kept within this many bytes: a bitset of vocab / 8 bytes (19 KB for GLM-5)
  // where many tokens are allowed, the list of allowed ids where few are.
  static constexpr size_t kMaxMaskBytes = size_t{24} << 20;

 private:
  struct Mask {
    std::vector<uint64_t> bits;  // dense: one bit per token
    std::vector<int32_t> ids;    // sparse: the allowed tokens
    bool dense = true;
    int count = 0;
  };
  const Mask& allowed_tokens(int32_t state);  // with mutex_ held
  void walk_trie(int32_t state, std::vector<uint64_t>& bits);

  std::mutex mutex_;
  std::shared_ptr<const Grammar> grammar_;
  Recognizer recognizer_;
  TokenTexts vocabulary_;
  int32_t start_;
  std::unordered_map<int32_t, Mask> masks_;
  size_t mask_bytes_ = 0;
  size_t masks_dropped_ = 0;  // times the cache was emptied for room
};

// A TokenConstraint that keeps the output within the matcher's grammar. A request whose grammar
// costs more than kMaxRequestGrammarWork stack expansions to follow (about a second of a core:
// grammars whose every byte keeps thousands of parses alive) stops there with failure() saying
// so, rather than hold the engine's host thread for seconds a token; the JSON schemas, regexes
// and tool calls tested here stay far below it.
inline constexpr uint64_t kMaxRequestGrammarWork = uint64_t{32} << 20;
std::shared_ptr<engine::TokenConstraint> make_grammar_constraint(std::shared_ptr<GrammarMatcher> matcher,
                                                                 uint64_t max_work = kMaxRequestGrammarWork);
// The same with a matcher of its own.
std::shared_ptr<engine::TokenConstraint> make_grammar_constraint(std::shared_ptr<const Grammar> grammar,
                                                                 TokenTexts vocabulary,
                                                                 uint64_t max_work = kMaxRequestGrammarWork);

}  // namespace glms::structured

// Added tokens (special and not) and how HF finds them in text: leftmost-longest match,
// honouring single_word, lstrip and rstrip.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glms::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

struct AddedTokenMatch {
  size_t begin = 0;  // includes whitespace taken by lstrip
  size_t end = 0;    // includes whitespace taken by rstrip
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }

  // Non-overlapping matches in `text`, left to right. At each position the longest token
  // wins; a single_word token next to a word character is not a match (the search resumes
  // after it); lstrip/rstrip extend the match over adjacent Unicode whitespace.
  std::vector<AddedTokenMatch> find(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_
  };
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

// Word characters as Rust's Unicode \w sees them (letters, marks, decimal digits, connector
// punctuation, joiners): used by single_word.
bool is_word_char(char32_t cp);

}  // namespace glms::text

// Normalizers as in Hugging Face tokenizer.json "normalizer": each rewrites a valid UTF-8
// string into a valid UTF-8 string. Alignment with the original text is not tracked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"

namespace glms::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

using NormalizerPtr = std::unique_ptr<const Normalizer>;

enum class UnicodeForm { NFC, NFD, NFKC, NFKD };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  void normalize(std::string& text) const override;

 private:
  UnicodeForm form_;
};

// Full Unicode lowercase mapping of every character.
class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override;
};

// Removes combining marks (general category Mn), as HF StripAccents does after NFD.
class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override;
};

// Replaces every match of `pattern` with `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override;

 private:
  Regex pattern_;
  std::string content_;
};

// Prepends `prefix` to non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override;

 private:
  std::string prefix_;
};

// Removes Unicode whitespace on the left and/or right.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override;

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<NormalizerPtr> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override;

 private:
  std::vector<NormalizerPtr> steps_;
};

// True for characters with the Unicode White_Space property.
bool is_unicode_whitespace(char32_t cp);

}  // namespace glms::text

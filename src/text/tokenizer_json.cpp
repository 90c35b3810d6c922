// Reads tokenizer.json (and tokenizer_config.json) into a TokenizerImpl. Every problem becomes
// a glms::Error that names the file, the JSON path and what is wrong.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace glms::text::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Thrown while walking the JSON; turned into a glms::Error with the file name at the top.
struct ConfigError {
  std::string message;
};

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw ConfigError{where + ": " + what}; }

const json& field(const json& object, const char* key, const std::string& where) {
  if (!object.is_object()) bad(where, "expected an object");
  auto it = object.find(key);
  if (it == object.end()) bad(where, std::string("missing field \"") + key + "\"");
  return *it;
}

template <typename T>
T value_or(const json& object, const char* key, T fallback, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    bad(where + "." + key, "has the wrong type (" + std::string(it->type_name()) + ")");
  }
}

std::string string_field(const json& object, const char* key, const std::string& where) {
  const json& v = field(object, key, where);
  if (!v.is_string()) bad(where + "." + key, "expected a string");
  return v.get<std::string>();
}

std::string type_of(const json& object, const std::string& where) { return string_field(object, "type", where); }

// HF patterns are {"String": "..."} (literal) or {"Regex": "..."}.
Regex pattern_of(const json& object, const std::string& where) {
  const json& pattern = field(object, "pattern", where);
  if (pattern.contains("String")) return Regex::literal(string_field(pattern, "String", where + ".pattern"));
  if (pattern.contains("Regex")) return Regex(string_field(pattern, "Regex", where + ".pattern"));
  bad(where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
}

template <typename Ptr, typename Parse>
std::vector<Ptr> parse_list(const json& object, const char* key, const std::string& where, Parse parse) {
  const json& list = field(object, key, where);
  if (!list.is_array()) bad(where + "." + key, "expected an array");
  std::vector<Ptr> steps;
  for (size_t i = 0; i < list.size(); ++i) {
    steps.push_back(parse(list[i], where + "." + key + "[" + std::to_string(i) + "]"));
  }
  return steps;
}

NormalizerPtr parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(pattern_of(j, where), string_field(j, "content", where));
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(string_field(j, "prepend", where));
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(value_or(j, "strip_left", true, where), value_or(j, "strip_right", true, where));
  }
  if (type == "Sequence") {
    return std::make_unique<SequenceNormalizer>(parse_list<NormalizerPtr>(j, "normalizers", where, parse_normalizer));
  }
  bad(where, "unsupported normalizer type \"" + type + "\"");
}

SplitBehavior parse_behavior(const json& j, const std::string& where) {
  const std::string b = string_field(j, "behavior", where);
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  bad(where + ".behavior", "unknown split behavior \"" + b + "\"");
}

PrependScheme parse_prepend_scheme(const json& j, const std::string& where) {
  if (j.contains("prepend_scheme")) {
    const std::string s = string_field(j, "prepend_scheme", where);
    if (s == "always") return PrependScheme::Always;
    if (s == "first") return PrependScheme::First;
    if (s == "never") return PrependScheme::Never;
    bad(where + ".prepend_scheme", "unknown value \"" + s + "\"");
  }
  return value_or(j, "add_prefix_space", true, where) ? PrependScheme::Always : PrependScheme::Never;
}

std::string single_char_string(const json& j, const char* key, const std::string& fallback, const std::string& where) {
  const std::string s = value_or(j, key, fallback, where);
  size_t pos = 0;
  if (s.empty() || !utf8::is_valid(s) || (utf8::decode_at(s, pos), pos != s.size())) {
    bad(where + "." + key, "expected a single character");
  }
  return s;
}

PreTokenizerPtr parse_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(value_or(j, "add_prefix_space", true, where),
                                                   value_or(j, "use_regex", true, where));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(pattern_of(j, where), parse_behavior(j, where),
                                               value_or(j, "invert", false, where));
  }
  if (type == "Digits") {
    const bool individual = value_or(j, "individual_digits", false, where);
    return std::make_unique<SplitPreTokenizer>(Regex(individual ? R"(\p{N})" : R"(\p{N}+)"), SplitBehavior::Isolated, false);
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\w+|[^\w\s]+)"), SplitBehavior::Removed, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\s+)"), SplitBehavior::Removed, false);
  }
  if (type == "Punctuation") {
    const SplitBehavior behavior = j.contains("behavior") ? parse_behavior(j, where) : SplitBehavior::Isolated;
    return std::make_unique<SplitPreTokenizer>(Regex(R"([\p{P}!-/:-@\[-`{-~])"), behavior, false);
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(single_char_string(j, "replacement", "\xE2\x96\x81", where),
                                                   parse_prepend_scheme(j, where), value_or(j, "split", true, where));
  }
  if (type == "Sequence") {
    return std::make_unique<SequencePreTokenizer>(parse_list<PreTokenizerPtr>(j, "pretokenizers", where, parse_pre_tokenizer));
  }
  bad(where, "unsupported pre_tokenizer type \"" + type + "\"");
}

DecoderPtr parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(pattern_of(j, where), string_field(j, "content", where));
  if (type == "Strip") {
    const std::string content = single_char_string(j, "content", " ", where);
    size_t pos = 0;
    return std::make_unique<StripDecoder>(utf8::decode_at(content, pos), value_or<size_t>(j, "start", 0, where),
                                          value_or<size_t>(j, "stop", 0, where));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(single_char_string(j, "replacement", "\xE2\x96\x81", where),
                                              parse_prepend_scheme(j, where) != PrependScheme::Never);
  }
  if (type == "Sequence") {
    return std::make_unique<SequenceDecoder>(parse_list<DecoderPtr>(j, "decoders", where, parse_decoder));
  }
  bad(where, "unsupported decoder type \"" + type + "\"");
}

std::unique_ptr<BpeModel> parse_model(const json& j, const std::string& where) {
  if (!j.is_object()) bad(where, "expected an object");
  const std::string type = value_or<std::string>(j, "type", "BPE", where);
  if (type != "BPE") bad(where, "unsupported model type \"" + type + "\" (only BPE is supported)");
  if (value_or(j, "dropout", 0.0, where) > 0.0) bad(where + ".dropout", "BPE dropout is not supported");

  const json& vocab_json = field(j, "vocab", where);
  if (!vocab_json.is_object()) bad(where + ".vocab", "expected an object of token -> id");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    if (!it.value().is_number_integer()) bad(where + ".vocab[\"" + it.key() + "\"]", "expected an integer id");
    vocab.emplace_back(it.key(), it.value().get<int32_t>());
  }

  std::vector<std::pair<std::string, std::string>> merges;
  if (auto it = j.find("merges"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) bad(where + ".merges", "expected an array");
    merges.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      const std::string at = where + ".merges[" + std::to_string(i) + "]";
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          bad(at, "expected \"left right\" with exactly one space, got \"" + s + "\"");
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        bad(at, "expected \"left right\" or [\"left\", \"right\"]");
      }
    }
  }

  BpeOptions options;
  if (auto it = j.find("unk_token"); it != j.end() && it->is_string()) options.unk_token = it->get<std::string>();
  options.continuing_subword_prefix = value_or<std::string>(j, "continuing_subword_prefix", "", where);
  options.end_of_word_suffix = value_or<std::string>(j, "end_of_word_suffix", "", where);
  options.fuse_unk = value_or(j, "fuse_unk", false, where);
  options.byte_fallback = value_or(j, "byte_fallback", false, where);
  options.ignore_merges = value_or(j, "ignore_merges", false, where);
  try {
    return std::make_unique<BpeModel>(std::move(vocab), std::move(merges), std::move(options));
  } catch (const Error& e) {
    bad(where, e.what());
  }
}

AddedToken parse_added_token(const json& j, const std::string& where) {
  AddedToken token;
  token.content = string_field(j, "content", where);
  token.special = value_or(j, "special", false, where);
  token.single_word = value_or(j, "single_word", false, where);
  token.lstrip = value_or(j, "lstrip", false, where);
  token.rstrip = value_or(j, "rstrip", false, where);
  token.normalized = value_or(j, "normalized", !token.special, where);
  if (token.content.empty()) bad(where + ".content", "added token content is empty");
  return token;
}

std::vector<int32_t> special_token_ids(const json& j, const std::string& name, const std::string& where) {
  const json& specials = field(j, "special_tokens", where);
  auto it = specials.find(name);
  if (it == specials.end()) bad(where + ".special_tokens", "no entry for \"" + name + "\"");
  const json& ids = field(*it, "ids", where + ".special_tokens." + name);
  if (!ids.is_array()) bad(where + ".special_tokens." + name + ".ids", "expected an array");
  std::vector<int32_t> out;
  for (const json& id : ids) out.push_back(id.get<int32_t>());
  return out;
}

// Adds the tokens a post-processor puts around a single sequence to `pp`.
void parse_post_processor(const json& j, const std::string& where, PostProcessor& pp) {
  if (j.is_null()) return;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = field(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      parse_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]", pp);
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json& cls = field(j, "cls", where);
    const json& sep = field(j, "sep", where);
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2) bad(where, "cls/sep must be [token, id]");
    pp.prefix.insert(pp.prefix.begin(), cls[1].get<int32_t>());
    pp.suffix.push_back(sep[1].get<int32_t>());
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = field(j, "single", where);
    if (!single.is_array()) bad(where + ".single", "expected an array");
    std::vector<int32_t> prefix;
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = string_field(piece["SpecialToken"], "id", at + ".SpecialToken");
        const std::vector<int32_t> ids = special_token_ids(j, name, where);
        auto& target = seen_sequence ? pp.suffix : prefix;
        target.insert(target.end(), ids.begin(), ids.end());
      } else {
        bad(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    pp.prefix.insert(pp.prefix.begin(), prefix.begin(), prefix.end());
    return;
  }
  bad(where, "unsupported post_processor type \"" + type + "\"");
}

json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::parse_error& e) {
    throw Error(file.string() + ": not valid JSON: " + e.what());
  }
}

// bos_token / eos_token in tokenizer_config.json: a string, {"content": ...} or null.
std::string config_token_name(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return {};
}

void apply_tokenizer_config(const json& config, TokenizerImpl& impl) {
  if (auto it = config.find("added_tokens_decoder"); it != config.end() && it->is_object()) {
    for (auto entry = it->begin(); entry != it->end(); ++entry) {
      const std::string where = "added_tokens_decoder[\"" + entry.key() + "\"]";
      int32_t id = -1;
      try {
        id = std::stoi(entry.key());
      } catch (const std::exception&) {
        bad(where, "key is not an integer id");
      }
      AddedToken token = parse_added_token(entry.value(), where);
      token.id = id;
      auto existing = std::find_if(impl.added_tokens.begin(), impl.added_tokens.end(),
                                   [&](const AddedToken& t) { return t.id == id; });
      if (existing != impl.added_tokens.end()) {
        *existing = token;
      } else {
        impl.added_tokens.push_back(token);
      }
    }
    impl.index_added_tokens();
  }
  const std::string bos = config_token_name(config, "bos_token");
  const std::string eos = config_token_name(config, "eos_token");
  if (!bos.empty()) impl.bos_id = impl.token_to_id(bos);
  if (!eos.empty()) impl.eos_id = impl.token_to_id(eos);
  // Llama-style fast tokenizers build their post-processor from these flags.
  if (impl.post_processor.prefix.empty() && impl.post_processor.suffix.empty()) {
    if (value_or(config, "add_bos_token", false, "tokenizer_config") && impl.bos_id >= 0) {
      impl.post_processor.prefix.push_back(impl.bos_id);
    }
    if (value_or(config, "add_eos_token", false, "tokenizer_config") && impl.eos_id >= 0) {
      impl.post_processor.suffix.push_back(impl.eos_id);
    }
  }
}

}  // namespace

std::shared_ptr<TokenizerImpl> load_tokenizer_json(const fs::path& file_or_dir) {
  const fs::path file = fs::is_directory(file_or_dir) ? file_or_dir / "tokenizer.json" : file_or_dir;
  if (!fs::exists(file)) throw Error(file.string() + ": tokenizer file does not exist");
  const json root = read_json(file);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->source = file;
  try {
    if (!root.is_object()) bad("(root)", "expected a JSON object");
    impl->model = parse_model(field(root, "model", "(root)"), "model");
    impl->normalizer = parse_normalizer(root.value("normalizer", json()), "normalizer");
    impl->pre_tokenizer = parse_pre_tokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer");
    impl->decoder = parse_decoder(root.value("decoder", json()), "decoder");
    if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
      if (!it->is_array()) bad("added_tokens", "expected an array");
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        AddedToken token = parse_added_token((*it)[i], where);
        const json& id = field((*it)[i], "id", where);
        if (!id.is_number_integer() || id.get<int64_t>() < 0) bad(where + ".id", "expected a non-negative integer");
        token.id = id.get<int32_t>();
        impl->added_tokens.push_back(std::move(token));
      }
    }
    impl->index_added_tokens();
    parse_post_processor(root.value("post_processor", json()), "post_processor", impl->post_processor);
  } catch (const ConfigError& e) {
    throw Error(file.string() + ": " + e.message);
  } catch (const Error& e) {
    throw Error(file.string() + ": " + e.what());
  } catch (const json::exception& e) {
    throw Error(file.string() + ": unexpected JSON structure: " + e.what());
  }

  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_file)) {
    const json config = read_json(config_file);
    try {
      if (config.is_object()) apply_tokenizer_config(config, *impl);
    } catch (const ConfigError& e) {
      throw Error(config_file.string() + ": " + e.message);
    } catch (const json::exception& e) {
      throw Error(config_file.string() + ": unexpected JSON structure: " + e.what());
    }
  }
  return impl;
}

}  // namespace glms::text::detail

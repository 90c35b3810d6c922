// libFuzzer target: chat-template rendering, template and conversation both fuzzed. The input is
// split at its first NUL byte: before it a Jinja template rendered over a fixed conversation,
// after it a conversation (JSON) rendered by the bundled GLM template. Either renders or throws
// glms::Error; nothing else (a crash, a hang past libFuzzer's timeout, another exception).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "text/chat_template.h"

// A fortieth of the server's limits: a template that spends them (nested loops writing text) would
// take longer than libFuzzer's timeout under the sanitizers; the server's own are in
// tests/text/test_chat_template.cpp.
glms::jinja::RenderLimits fuzz_limits() {
  glms::jinja::RenderLimits limits;
  limits.max_steps /= 40;
  limits.max_output_bytes /= 40;
  return limits;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const glms::jinja::RenderLimits limits = fuzz_limits();
  static const glms::ChatTemplate glm = glms::ChatTemplate::load(GLMS_FUZZ_MODEL_DIR);
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string source = input.substr(0, split);
  const std::string conversation = split == std::string::npos ? "" : input.substr(split + 1);
  try {
    const auto t = glms::ChatTemplate::from_source(source, "<s>", "</s>");
    (void)t.render(R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])",
                   R"([{"type":"function","function":{"name":"f","parameters":{}}}])", true, R"({"enable_thinking":false})",
                   limits);
  } catch (const glms::Error&) {
  }
  if (!conversation.empty()) {
    try {
      (void)glm.render(conversation, "", true, "", limits);
    } catch (const glms::Error&) {
    }
  }
  return 0;
}

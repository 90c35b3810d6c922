// libFuzzer target: the bundled model's tokenizer. Valid UTF-8 text encodes and decodes back to
// itself (byte-level BPE loses nothing); any bytes read as token ids decode without a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "text/tokenizer.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const glms::text::Tokenizer tokenizer = glms::text::Tokenizer::load(GLMS_FUZZ_TOKENIZER);
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (glms::text::utf8::is_valid(text)) {
    const std::vector<int32_t> ids = tokenizer.encode(text, false);
    if (tokenizer.decode(ids, false) != text) std::abort();
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) ids.push_back((data[i] << 8 | data[i + 1]) % tokenizer.vocab_size());
  (void)tokenizer.decode(ids, true);
  (void)tokenizer.decode(ids, false);
  return 0;
}

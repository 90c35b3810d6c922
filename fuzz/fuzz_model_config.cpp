// libFuzzer entry: any text given to parse_model_config must either parse into a consistent
// ModelConfig or throw glms::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto config = glms::io::parse_model_config(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
    const auto layers = static_cast<size_t>(config.num_hidden_layers);
    if (config.indexer_full.size() != layers || config.layer_is_moe.size() != layers ||
        !config.indexer_full[0] || config.n_routed_experts % config.n_group != 0)
      std::abort();
    (void)config.attention_scale();
  } catch (const glms::Error&) {
  }
  return 0;
}

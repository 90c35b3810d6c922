// libFuzzer target: bytes as a checkpoint's model.safetensors.index.json (in a private temporary
// folder, with no shards beside it). Checkpoint::open must throw glms::Error naming what is wrong
// (any index, even a valid one, points at shards that are not there) and never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("glms-fuzz-index-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    (void)glms::io::Checkpoint::open(dir);
    std::abort();  // no shard exists: opening cannot succeed
  } catch (const glms::Error& e) {
    if (std::string(e.what()).empty()) std::abort();
  }
  return 0;
}

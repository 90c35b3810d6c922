// libFuzzer entry: any byte string given to SafetensorsFile::from_memory must either parse or
// throw glms::Error; every tensor of a parsed file must lie inside the input (ASan checks the
// reads done by read_f32 / read_i64).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = glms::io::SafetensorsFile::from_memory(reinterpret_cast<const std::byte*>(data),
                                                       size, "fuzz");
    for (const auto& tensor : file->tensors()) {
      const auto* begin = reinterpret_cast<const std::byte*>(data);
      if (tensor.nbytes && (tensor.data < begin || tensor.data + tensor.nbytes > begin + size))
        std::abort();
      try {
        (void)glms::io::read_f32(tensor);
      } catch (const glms::Error&) {
        (void)glms::io::read_i64(tensor);
      }
    }
  } catch (const glms::Error&) {
  }
  return 0;
}

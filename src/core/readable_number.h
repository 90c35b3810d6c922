// Numbers as people and vLLM's command lines write them: "8192", "8k" (8000), "8K" (8192),
// "25.6k", "2G" / "2GiB" (2^31), "2GB" (2e9). Lower-case suffixes (k, m, g, t) are powers of
// 1000 and upper-case ones powers of 1024, as vLLM reads --max-model-len; "B", "iB" and "b" after a
// suffix are allowed for byte counts (KB/MB/GB/TB decimal, KiB/MiB/GiB/TiB binary).
#pragma once

#include <cstdint>
#include <string>

namespace glms {

// The value `text` denotes, a whole non-negative number. Throws glms::Error naming `flag` and
// the accepted forms when `text` is not one, or is not whole, or is out of int64 range.
int64_t parse_readable_count(const std::string& text, const std::string& flag);

}  // namespace glms

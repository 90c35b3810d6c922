// The server's log: timestamped, levelled lines on stderr through spdlog (Debian's
// libspdlog-dev), as text ("2026-12-02 10:00:00.123 INFO  message") or one JSON object a line
// ({"time", "level", "msg"}). Messages are formatted by the caller (fmt); spdlog stays out of
// this header. Thread-safe; before configure() lines go out as text at info.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace glms::log {

enum class Level { kTrace, kDebug, kInfo, kWarning, kError, kOff };
enum class Format { kText, kJson };

// "trace", "debug", "info", "warning" (or "warn"), "error", "off"; throws glms::Error naming the
// accepted ones otherwise.
Level parse_level(const std::string& name);
Format parse_format(const std::string& name);  // "text" or "json"

// Sets the level and format of every later line; `sink` (tests) receives them instead of stderr.
void configure(Level level, Format format, std::ostream* sink = nullptr);
bool enabled(Level level);

void write(Level level, std::string_view message);
inline void debug(std::string_view message) { write(Level::kDebug, message); }
inline void info(std::string_view message) { write(Level::kInfo, message); }
inline void warning(std::string_view message) { write(Level::kWarning, message); }
inline void error(std::string_view message) { write(Level::kError, message); }

// `text` as the inside of a JSON string (quotes, backslashes and control characters escaped).
std::string json_escape(std::string_view text);

}  // namespace glms::log

// Server-sent events as OpenAI-compatible servers stream them, and the meaning of one event's
// data for /v1/completions and /v1/chat/completions chunks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace glms::bench {

// Incremental SSE parser (WHATWG event-stream rules that matter here): lines end in \n, \r\n
// or \r; "data:" lines (one optional space after the colon) of one event are joined with \n;
// a blank line ends the event; comment lines (":...") and other fields are ignored. Bytes may
// arrive split anywhere, including inside a \r\n pair.
class SseParser {
 public:
  // Appends the data of every event completed by `bytes` to `events`.
  void feed(std::string_view bytes, std::vector<std::string>& events);
  // The data of an event left without its closing blank line when the stream ended (or empty).
  std::string finish();

 private:
  void line(std::string_view l, std::vector<std::string>& events);
  std::string partial_;  // an unfinished line
  std::string data_;     // data of the current event
  bool has_data_ = false;
  bool skip_lf_ = false;  // the previous byte was a \r that ended a line
};

// What one event's data says.
struct StreamEvent {
  bool done = false;       // data: [DONE]
  bool malformed = false;  // not JSON: `error` holds the start of the data
  std::string error;       // an {"error": ...} event's message (or the malformed data)
  std::string text;        // generated text of choice 0: completions `text`, chat `delta.content`,
                           // `delta.reasoning_content` / `delta.reasoning`, tool-call arguments
  bool token = false;      // the event carries generated output (text, reasoning or tool calls)
  bool has_usage = false;  // a non-null `usage` object
  int prompt_tokens = 0, completion_tokens = 0;
  int cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1: not reported
  std::string finish_reason;
};
StreamEvent interpret_event(std::string_view data);

}  // namespace glms::bench

// Comma-separated integer options of the micro-benchmarks ("8,64,128").
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace glms::benchmarks {

inline std::vector<int> parse_int_list(const char* text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace glms::benchmarks

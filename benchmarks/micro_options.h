// What the CUDA micro-benchmarks (benchmarks/cuda_*.cpp) share: their "--name value" options,
// comma-separated integer lists ("8,64,128"), and the relative L2 distance by which each path's
// output is checked against a reference path's.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
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

// "--name value" pairs, each value handed to its name's handler. An unknown name, or a name
// without a value, is reported on stderr and returns false (the caller exits with 2).
using OptionHandlers = std::map<std::string, std::function<void(const char*)>>;
inline bool parse_options(int argc, char** argv, const OptionHandlers& handlers) {
  for (int i = 1; i < argc; i += 2) {
    const auto handler = handlers.find(argv[i]);
    if (handler == handlers.end() || i + 1 >= argc) {
      std::fprintf(stderr, handler == handlers.end() ? "unknown option %s\n" : "option %s needs a value\n", argv[i]);
      return false;
    }
    handler->second(argv[i + 1]);
  }
  return true;
}

// ||got - want|| / ||want|| over the values as `widen` reads them (||got - want|| where want is 0).
template <typename T, typename Widen>
double relative_l2(const std::vector<T>& got, const std::vector<T>& want, Widen widen) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = widen(got[i]), w = widen(want[i]);
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_l2(got, want, [](float v) { return double(v); });
}

}  // namespace glms::benchmarks

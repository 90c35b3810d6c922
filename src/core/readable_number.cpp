#include "core/readable_number.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace glms {

int64_t parse_readable_count(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) -> int64_t {
    fail(flag + ": '" + text + "' " + why + " (give a whole number such as 8192, or with a suffix: 8k = 8000, 8K = 8192, "
         "2G = 2GiB = 2^31, 2GB = 2e9)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad("is not a number");
  char* end = nullptr;
  const std::string digits = text.substr(0, i);
  const double value = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) return bad("is not a number");
  std::string suffix = text.substr(i);
  double scale = 1;
  if (!suffix.empty()) {
    const char unit = suffix[0];
    const int power = std::string("kmgt").find(static_cast<char>(std::tolower(static_cast<unsigned char>(unit)))) + 1;
    if (power == 0) return bad("has an unknown suffix");
    std::string rest = suffix.substr(1);
    bool binary = std::isupper(static_cast<unsigned char>(unit)) != 0;
    if (rest == "iB") binary = true;
    else if (rest == "B" || rest == "b") binary = false;
    else if (!rest.empty()) return bad("has an unknown suffix");
    scale = std::pow(binary ? 1024.0 : 1000.0, power);
  }
  const double total = value * scale;
  if (!(total >= 0) || total > 9.2e18) return bad("is out of range");
  if (std::fabs(total - std::round(total)) > 1e-6 * std::max(1.0, total)) return bad("is not a whole number");
  return static_cast<int64_t>(std::llround(total));
}

}  // namespace glms

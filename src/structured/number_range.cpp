#include "structured/number_range.h"

#include <charconv>
#include <vector>

#include "core/error.h"

namespace glms::structured {

namespace {

ByteSet digit_range(char lo, char hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<size_t>(c));
  return s;
}
// Between min and max digits (none when max is 0).
Expr digits(int min, int max) { return max == 0 ? sequence({}) : repeat(bytes(digit_range('0', '9')), min, max); }
Expr zeros(int min, int max) { return max == 0 ? sequence({}) : repeat(literal("0"), min, max); }

// Numbers between a and z, two decimal strings of one width (leading zeros allowed).
Expr same_width(const std::string& a, const std::string& z) {
  if (a.size() == 1) return bytes(digit_range(a[0], z[0]));
  const std::string rest_a = a.substr(1), rest_z = z.substr(1);
  if (a[0] == z[0]) return sequence({literal(a.substr(0, 1)), same_width(rest_a, rest_z)});
  const std::string all0(rest_a.size(), '0'), all9(rest_a.size(), '9');
  const int w = static_cast<int>(rest_a.size());
  if (rest_a == all0 && rest_z == all9) return sequence({bytes(digit_range(a[0], z[0])), digits(w, w)});
  std::vector<Expr> options{sequence({literal(a.substr(0, 1)), same_width(rest_a, all9)})};
  if (a[0] + 1 <= z[0] - 1) options.push_back(sequence({bytes(digit_range(a[0] + 1, z[0] - 1)), digits(w, w)}));
  options.push_back(sequence({literal(z.substr(0, 1)), same_width(all0, rest_z)}));
  return choice(std::move(options));
}

// A non-negative decimal at a fixed scale: its integer part and exactly `scale` fraction digits.
struct Fixed {
  int64_t integer = 0;
  std::string fraction;
};
int compare(const Fixed& a, const Fixed& b) {
  if (a.integer != b.integer) return a.integer < b.integer ? -1 : 1;
  return a.fraction.compare(b.fraction);  // one length
}
// One unit in the last place up; false past the largest value written.
bool increment(Fixed& a) {
  for (size_t i = a.fraction.size(); i-- > 0;) {
    if (a.fraction[i] != '9') {
      ++a.fraction[i];
      return true;
    }
    a.fraction[i] = '0';
  }
  return a.integer++ < kLargestInteger;
}
// One unit down (a above zero).
void decrement(Fixed& a) {
  for (size_t i = a.fraction.size(); i-- > 0;) {
    if (a.fraction[i] != '0') {
      --a.fraction[i];
      return;
    }
    a.fraction[i] = '9';
  }
  --a.integer;
}

// Values in [a, b] at `scale`: integer digits, then "." and the scale's fraction digits.
Expr fixed_range(const Fixed& a, const Fixed& b, int scale) {
  if (scale == 0) return natural_range(a.integer, b.integer);
  auto written = [](Expr integer, Expr fraction) { return sequence({std::move(integer), literal("."), std::move(fraction)}); };
  if (a.integer == b.integer) return written(literal(std::to_string(a.integer)), same_width(a.fraction, b.fraction));
  const std::string all0(static_cast<size_t>(scale), '0'), all9(static_cast<size_t>(scale), '9');
  std::vector<Expr> options{written(literal(std::to_string(a.integer)), same_width(a.fraction, all9))};
  if (a.integer + 1 <= b.integer - 1)
    options.push_back(written(natural_range(a.integer + 1, b.integer - 1), digits(scale, scale)));
  options.push_back(written(literal(std::to_string(b.integer)), same_width(all0, b.fraction)));
  return choice(std::move(options));
}

// What may follow a value's digits at `scale` (at scale 0 the point too): any further fraction
// digits, only zeros, or digits with a nonzero one among them.
enum class Rest { kAny, kZeros, kNonzero };
std::optional<Expr> rest(Rest kind, int scale) {
  const int room = kMaxFractionDigits - scale;
  const Expr nonzero = bytes(digit_range('1', '9'));
  if (scale == 0) {
    if (kind == Rest::kAny) return optional(sequence({literal("."), digits(1, room)}));
    if (kind == Rest::kZeros) return optional(sequence({literal("."), zeros(1, room)}));
    return sequence({literal("."), zeros(0, room - 1), nonzero, digits(0, room - 1)});
  }
  if (kind == Rest::kAny) return digits(0, room);
  if (kind == Rest::kZeros) return zeros(0, room);
  if (room == 0) return std::nullopt;
  return sequence({zeros(0, room - 1), nonzero, digits(0, room - 1)});
}

// A bound of a non-negative value at a scale.
struct Limit {
  Fixed value;
  bool exclusive = false;
};

// Non-negative x with lo <= x (< with lo.exclusive) and x <= hi (likewise; none: as large as
// written), at `scale`: x's digits to the scale say how x stands against the bounds, and the
// digits past it decide only where they equal a bound. Nothing where no x fits.
std::optional<Expr> non_negative_range(const Limit& lo, const std::optional<Limit>& hi, int scale) {
  std::vector<Expr> options;
  auto add = [&](const Fixed& a, const Fixed& b, Rest kind) {
    if (auto r = rest(kind, scale)) options.push_back(sequence({fixed_range(a, b, scale), *r}));
  };
  if (hi && compare(lo.value, hi->value) > 0) return std::nullopt;
  if (hi && compare(lo.value, hi->value) == 0) {
    if (!lo.exclusive && !hi->exclusive) add(lo.value, lo.value, Rest::kZeros);
  } else {
    add(lo.value, lo.value, lo.exclusive ? Rest::kNonzero : Rest::kAny);
    Fixed above = lo.value;
    const Fixed top = hi ? hi->value : Fixed{kLargestInteger, std::string(static_cast<size_t>(scale), '9')};
    if (increment(above)) {
      Fixed below = top;
      if (hi) decrement(below);
      if (compare(above, below) <= 0) add(above, below, Rest::kAny);
    }
    if (hi && !hi->exclusive) add(hi->value, hi->value, Rest::kZeros);
  }
  if (options.empty()) return std::nullopt;
  return choice(std::move(options));
}

bool is_zero(const DecimalBound& b) { return b.integer == "0" && b.fraction.empty(); }

}  // namespace

Expr natural_range(int64_t lo, int64_t hi) {
  std::vector<Expr> options;
  int64_t low_of_width = 0, high_of_width = 9;
  for (int width = 1; low_of_width <= hi; ++width) {
    const int64_t a = std::max(lo, low_of_width), z = std::min(hi, high_of_width);
    if (a <= z) options.push_back(same_width(std::to_string(a), std::to_string(z)));
    if (high_of_width > kLargestInteger / 10) break;
    low_of_width = high_of_width + 1;
    high_of_width = high_of_width * 10 + 9;
  }
  return choice(std::move(options));
}

DecimalBound decimal_bound(double value, bool exclusive) {
  char text[512];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value, std::chars_format::fixed);
  GLMS_CHECK(error == std::errc(), "decimal_bound: the value does not fit its buffer");
  std::string s(text, end);
  DecimalBound b;
  b.exclusive = exclusive;
  if (!s.empty() && s[0] == '-') {
    b.negative = true;
    s.erase(0, 1);
  }
  const size_t point = s.find('.');
  b.integer = s.substr(0, point);
  if (point != std::string::npos) b.fraction = s.substr(point + 1);
  while (!b.fraction.empty() && b.fraction.back() == '0') b.fraction.pop_back();
  if (is_zero(b)) b.negative = false;  // -0 is 0
  return b;
}

Expr integer_range(int64_t lo, int64_t hi) {
  std::vector<Expr> options;
  if (lo < 0) options.push_back(sequence({literal("-"), natural_range(hi < 0 ? -hi : 1, -lo)}));
  if (hi >= 0) options.push_back(natural_range(std::max<int64_t>(lo, 0), hi));
  return choice(std::move(options));
}

std::optional<Expr> decimal_range(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi,
                                  const std::string& path) {
  size_t scale = 0;
  for (const auto* b : {&lo, &hi})
    if (*b) {
      if ((*b)->fraction.size() > static_cast<size_t>(kMaxFractionDigits))
        fail(path + ": a bound with more than " + std::to_string(kMaxFractionDigits) + " fraction digits");
      scale = std::max(scale, (*b)->fraction.size());
    }
  const int s = static_cast<int>(scale);
  // A bound's magnitude at the scale; nothing where it is past every number written.
  auto magnitude = [&](const DecimalBound& b) -> std::optional<Fixed> {
    if (b.integer.size() > static_cast<size_t>(kMaxIntegerDigits)) return std::nullopt;
    return Fixed{std::stoll(b.integer), b.fraction + std::string(scale - b.fraction.size(), '0')};
  };
  const Fixed zero{0, std::string(scale, '0')};
  std::vector<Expr> options;
  // x >= 0: from lo where lo is not negative (else from 0), to hi unless hi is negative.
  const bool lo_negative = lo && lo->negative, hi_negative = hi && hi->negative;
  if (!hi_negative) {
    Limit from{zero, false};
    bool fits = true;
    if (lo && !lo_negative) {
      const auto m = magnitude(*lo);
      fits = m.has_value();
      if (m) from = {*m, lo->exclusive};
    }
    std::optional<Limit> to;
    if (hi) {
      if (const auto m = magnitude(*hi)) to = Limit{*m, hi->exclusive};  // else past every number: no bound
    }
    if (fits)
      if (auto e = non_negative_range(from, to, s)) options.push_back(std::move(*e));
  }
  // x < 0, written "-" y: y > 0 and y >= -hi where hi is negative, y <= -lo where lo is.
  if (!lo || lo_negative) {
    Limit from{zero, true};
    bool fits = true;
    if (hi_negative) {
      const auto m = magnitude(*hi);
      fits = m.has_value();
      if (m) from = {*m, hi->exclusive};
    }
    std::optional<Limit> to;
    if (lo_negative) {
      if (const auto m = magnitude(*lo)) to = Limit{*m, lo->exclusive};
    }
    if (fits)
      if (auto e = non_negative_range(from, to, s)) options.push_back(sequence({literal("-"), std::move(*e)}));
  }
  if (options.empty()) return std::nullopt;
  return choice(std::move(options));
}

}  // namespace glms::structured

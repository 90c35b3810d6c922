#include "bench/svg.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace glms::bench {

double nice_step(double range, int target) {
  if (!(range > 0) || !std::isfinite(range)) return 1;
  const double raw = range / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nice * mag;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

namespace {

std::string tick_text(double v, double step) {
  if (step >= 1 && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  const int decimals = std::min(6, static_cast<int>(std::ceil(-std::log10(step))));
  return fmt::format("{:.{}f}", v, decimals);
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

std::string render_svg(const Chart& chart) {
  const double W = chart.width, H = chart.height;
  const double left = 80, right = 170, top = 50, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  double xmax = 0, ymax = 0;
  for (const auto& s : chart.series)
    for (const auto& p : s.points) {
      if (std::isfinite(p.x)) xmax = std::max(xmax, p.x);
      if (std::isfinite(p.y)) ymax = std::max(ymax, p.y);
    }
  const double xstep = nice_step(xmax > 0 ? xmax : 1), ystep = nice_step(ymax > 0 ? ymax : 1);
  const double xtop = std::max(xstep, std::ceil(xmax / xstep * (1 + 1e-9)) * xstep);
  const double ytop = std::max(ystep, std::ceil(ymax / ystep * (1 + 1e-9)) * ystep);
  auto X = [&](double x) { return left + pw * std::clamp(x / xtop, 0.0, 1.0); };
  auto Y = [&](double y) { return top + ph * (1 - std::clamp(y / ytop, 0.0, 1.0)); };

  std::string o;
  o += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H);
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o += fmt::format("<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n", left + pw / 2,
                   xml_escape(chart.title));
  // Grid and ticks.
  for (double v = 0; v <= xtop * (1 + 1e-9); v += xstep) {
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e0e0e0\"/>\n", X(v),
                     top, top + ph);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", X(v), top + ph + 18,
                     tick_text(v, xstep));
  }
  for (double v = 0; v <= ytop * (1 + 1e-9); v += ystep) {
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#e0e0e0\"/>\n", left,
                     Y(v), left + pw);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, Y(v) + 4,
                     tick_text(v, ystep));
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left, top,
                   pw, ph);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2, H - 15,
                   xml_escape(chart.x_label));
  o += fmt::format(
      "<text x=\"18\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0:.1f})\">{1}</text>\n",
      top + ph / 2, xml_escape(chart.y_label));
  // Series.
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const ChartSeries& s = chart.series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    std::string pts;
    for (const auto& p : s.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) pts += fmt::format("{:.1f},{:.1f} ", X(p.x), Y(p.y));
    if (!pts.empty()) pts.pop_back();
    o += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", color, pts);
    for (const auto& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{}</title></circle>\n", X(p.x),
                       Y(p.y), color, xml_escape(fmt::format("{} ({:.4g}, {:.4g})", p.label, p.x, p.y)));
      if (!p.label.empty())
        o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"{}\">{}</text>\n", X(p.x) + 5,
                         Y(p.y) - 5, color, xml_escape(p.label));
    }
    const double ly = top + 10 + 20 * static_cast<double>(i);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" stroke-width=\"2\"/>\n",
                     left + pw + 12, ly, left + pw + 32, color);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", left + pw + 38, ly + 4, xml_escape(s.name));
  }
  o += "</svg>\n";
  return o;
}

}  // namespace glms::bench

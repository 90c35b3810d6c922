// Small self-contained SVG line charts (no scripts, no external resources) that any browser
// opens: linear axes with round tick values, one polyline + markers per series, a legend,
// and optional point labels.
#pragma once

#include <string>
#include <vector>

namespace glms::bench {

struct ChartPoint {
  double x = 0, y = 0;
  std::string label;  // drawn next to the marker when not empty
};
struct ChartSeries {
  std::string name;
  std::vector<ChartPoint> points;  // drawn in the given order
};
struct Chart {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;
  int width = 760, height = 460;
};

// A complete SVG document. Axes start at 0 and end at a round value above the largest point.
std::string render_svg(const Chart& chart);

// "Nice" tick step for a range: 1, 2 or 5 times a power of ten, giving about `target` ticks.
double nice_step(double range, int target = 5);
std::string xml_escape(const std::string& s);

}  // namespace glms::bench

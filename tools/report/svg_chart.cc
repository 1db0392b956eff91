#include "tools/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "tools/report/report_units.h"

namespace spillway::report {

namespace {

constexpr double kWidth = 1000;
constexpr double kHeight = 280;
constexpr double kLeft = 80;   // room for the y labels
constexpr double kRight = 40;  // room for the last time label
constexpr double kTop = 44;    // title and legend
constexpr double kBottom = 34;
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kPlotHeight = kHeight - kTop - kBottom;
constexpr int kTimeTicks = 5;
// More marks than this are thinned to every n-th, so a long run's steps
// do not paint the chart solid.
constexpr std::size_t kMaxMarks = 200;

// The axis top: the smallest "round" value at least `value`, with a tick
// count that makes every tick label round too (2 GiB in 4 ticks of 512 MiB,
// not 5 of 409.6). Bytes are rounded in powers of 1024, then of ten.
struct AxisScale {
  double top = 1;
  int ticks = 4;
};

AxisScale axis_scale(double value, ChartUnit unit) {
  if (value <= 0) return {};
  double scale = 1;
  if (unit == ChartUnit::bytes) {
    while (value / scale >= 1024) scale *= 1024;
  }
  const double reduced = value / scale;
  const double power = std::pow(10.0, std::floor(std::log10(reduced)));
  struct Choice {
    double mantissa;
    int ticks;
  };
  for (const Choice choice :
       {Choice{1, 4}, Choice{1.5, 3}, Choice{2, 4}, Choice{2.5, 5}, Choice{3, 3}, Choice{4, 4},
        Choice{5, 5}, Choice{6, 3}, Choice{8, 4}, Choice{10, 5}}) {
    if (choice.mantissa * power >= reduced) return {choice.mantissa * power * scale, choice.ticks};
  }
  return {10 * power * scale, 5};
}

std::string axis_label(double value, ChartUnit unit) {
  return unit == ChartUnit::bytes ? format_bytes_short(value) : format_duration_short(value);
}

class Plot {
 public:
  Plot(double x_span, double y_max) : x_span_(std::max(x_span, 1.0)), y_max_(y_max) {}
  double x(double ns) const { return kLeft + std::clamp(ns / x_span_, 0.0, 1.0) * kPlotWidth; }
  double y(double value) const {
    return kTop + kPlotHeight - std::clamp(value / y_max_, 0.0, 1.0) * kPlotHeight;
  }

  // "x,y x,y ..." of a step function, held to the end of the axis.
  std::string step_points(const std::vector<double>& times, const std::vector<double>& values,
                          bool reversed) const {
    std::vector<std::pair<double, double>> points;
    for (std::size_t i = 0; i < times.size(); ++i) {
      const double next = i + 1 < times.size() ? times[i + 1] : x_span_;
      points.emplace_back(x(times[i]), y(values[i]));
      points.emplace_back(x(next), y(values[i]));
    }
    if (reversed) std::reverse(points.begin(), points.end());
    std::string out;
    for (const auto& [px, py] : points)
      fmt::format_to(std::back_inserter(out), "{:.1f},{:.1f} ", px, py);
    return out;
  }

 private:
  double x_span_;
  double y_max_;
};

double largest_value(const ChartSpec& spec) {
  double largest = 0;
  for (const ChartBand& band : spec.bands) {
    for (const double v : band.upper) largest = std::max(largest, v);
  }
  for (const ChartLine& line : spec.lines) {
    for (const double v : line.values) largest = std::max(largest, v);
  }
  for (const ChartRule& rule : spec.rules) largest = std::max(largest, rule.value);
  for (const ChartBars& bars : spec.bars) {
    for (const double v : bars.values) largest = std::max(largest, v);
  }
  return largest;
}

}  // namespace

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg_chart(const ChartSpec& spec) {
  const AxisScale scale = axis_scale(largest_value(spec) * 1.05, spec.unit);
  const double y_max = scale.top;
  const Plot plot(spec.x_span, y_max);
  std::string out;
  auto put = std::back_inserter(out);
  fmt::format_to(put,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\">\n",
                 kWidth, kHeight, escape_html(spec.title));
  fmt::format_to(put, "<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", kLeft,
                 escape_html(spec.title));

  // Grid and axes.
  for (int i = 0; i <= scale.ticks; ++i) {
    const double value = y_max * i / scale.ticks;
    fmt::format_to(put,
                   "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/>"
                   "<text x=\"{3}\" y=\"{4:.1f}\" class=\"ylabel\">{5}</text>\n",
                   kLeft, kLeft + kPlotWidth, plot.y(value), kLeft - 6, plot.y(value) + 4,
                   escape_html(axis_label(value, spec.unit)));
  }
  for (int i = 0; i <= kTimeTicks; ++i) {
    const double ns = spec.x_span * i / kTimeTicks;
    fmt::format_to(put, "<text x=\"{:.1f}\" y=\"{}\" class=\"xlabel\">{}</text>\n", plot.x(ns),
                   kHeight - kBottom + 16, escape_html(format_duration_short(ns)));
  }
  fmt::format_to(put, "<text x=\"{}\" y=\"{}\" class=\"xlabel\">time since first event</text>\n",
                 kLeft + kPlotWidth / 2, kHeight - 4);

  // Bands, bars, lines, rules, then marks, so marks stay visible.
  for (const ChartBand& band : spec.bands) {
    fmt::format_to(put, "<polygon points=\"{}{}\" fill=\"{}\" fill-opacity=\"0.75\"/>\n",
                   plot.step_points(band.times, band.upper, false),
                   plot.step_points(band.times, band.lower, true), band.color);
  }
  if (!spec.bars.empty()) {
    const std::size_t buckets = spec.bars.front().values.size();
    const double bucket_width = kPlotWidth / std::max<std::size_t>(buckets, 1);
    const double bar_width = bucket_width / spec.bars.size();
    for (std::size_t set = 0; set < spec.bars.size(); ++set) {
      const ChartBars& bars = spec.bars[set];
      for (std::size_t i = 0; i < bars.values.size(); ++i) {
        if (bars.values[i] <= 0) continue;
        const double top = plot.y(bars.values[i]);
        fmt::format_to(put,
                       "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
                       "fill=\"{}\"/>\n",
                       kLeft + i * bucket_width + set * bar_width, top, bar_width,
                       kTop + kPlotHeight - top, bars.color);
      }
    }
  }
  for (const ChartLine& line : spec.lines) {
    fmt::format_to(put,
                   "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}/>\n",
                   plot.step_points(line.times, line.values, false), line.color,
                   line.dashed ? " stroke-dasharray=\"6 3\"" : "");
  }
  for (const ChartRule& rule : spec.rules) {
    fmt::format_to(put,
                   "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" "
                   "stroke-width=\"1.5\" stroke-dasharray=\"2 3\"/>\n",
                   kLeft, kLeft + kPlotWidth, plot.y(rule.value), rule.color);
  }
  const std::size_t mark_stride = spec.marks.size() / kMaxMarks + 1;
  for (std::size_t i = 0; i < spec.marks.size(); i += mark_stride) {
    fmt::format_to(put,
                   "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"mark\"/>\n",
                   plot.x(spec.marks[i]), kTop, kTop + kPlotHeight);
  }
  fmt::format_to(put, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n",
                 kLeft, kTop, kPlotWidth, kPlotHeight);

  // Legend, one row under the title.
  double legend_x = kLeft;
  const auto legend = [&](const std::string& label, const std::string& color) {
    fmt::format_to(put,
                   "<rect x=\"{0:.0f}\" y=\"27\" width=\"12\" height=\"10\" fill=\"{1}\"/>"
                   "<text x=\"{2:.0f}\" y=\"36\" class=\"legend\">{3}</text>\n",
                   legend_x, color, legend_x + 16, escape_html(label));
    legend_x += 28 + 7 * label.size();
  };
  for (const ChartBand& band : spec.bands) legend(band.label, band.color);
  for (const ChartBars& bars : spec.bars) legend(bars.label, bars.color);
  for (const ChartLine& line : spec.lines) legend(line.label, line.color);
  for (const ChartRule& rule : spec.rules) legend(rule.label, rule.color);
  if (!spec.marks.empty()) legend(spec.marks_label, "#999999");
  out += "</svg>\n";
  return out;
}

}  // namespace spillway::report

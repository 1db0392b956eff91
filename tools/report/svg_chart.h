// SvgChart: one time chart as inline SVG text, for the HTML report. No
// scripts, no external references; colors and sizes are attributes, so the
// markup renders the same anywhere.
//
// The x axis is nanoseconds since the trace's first event. Values are step
// functions: a sample holds until the next one (memory only changes at
// events), so bands and lines are drawn as steps, not slopes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace spillway::report {

enum class ChartUnit { bytes, nanoseconds };

// A filled band between two step functions sampled at the same times
// (stacked areas are bands whose lower edge is the previous band's upper).
struct ChartBand {
  std::string label;
  std::string color;
  std::vector<double> times;
  std::vector<double> lower;
  std::vector<double> upper;
};

// A step line.
struct ChartLine {
  std::string label;
  std::string color;
  std::vector<double> times;
  std::vector<double> values;
  bool dashed = false;
};

// A horizontal rule across the chart, e.g. the device budget.
struct ChartRule {
  std::string label;
  std::string color;
  double value = 0;
};

// Bars over equal time buckets; several sets share each bucket side by side.
struct ChartBars {
  std::string label;
  std::string color;
  std::vector<double> values;  // one per bucket, buckets evenly cover [0, x_span]
};

struct ChartSpec {
  std::string title;
  double x_span = 1;  // nanoseconds covered by the x axis
  ChartUnit unit = ChartUnit::bytes;
  std::vector<ChartBand> bands;
  std::vector<ChartLine> lines;
  std::vector<ChartRule> rules;
  std::vector<ChartBars> bars;
  std::vector<double> marks;  // vertical marks (step boundaries), in ns
  std::string marks_label;
};

// The <svg> element for `spec`. Text is escaped.
std::string render_svg_chart(const ChartSpec& spec);

// Escapes &, <, >, " and ' for HTML text and attribute values.
std::string escape_html(std::string_view text);

}  // namespace spillway::report

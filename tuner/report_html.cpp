// The report as one self-contained HTML page: inline CSS, and per (problem, bucket) an inline
// SVG bar chart of the candidates' achieved bandwidth with the copy-bandwidth roofline when it
// was measured. No script and nothing fetched, so the page works offline and as an artifact.
// Every element is closed explicitly, so strict parsers (and XML tools) read it too.
#include <algorithm>
#include <string>

#include "tuner/report.h"
#include "tuner/report_text.h"

namespace kiln::report {
namespace {

using detail::fixed;
using detail::text_or_unknown;
using detail::times;
using nlohmann::json;

constexpr int kChartWidth = 760;
constexpr int kLabelWidth = 230;
constexpr int kValueWidth = 90;
constexpr int kBarHeight = 16;
constexpr int kBarGap = 6;
constexpr int kTopMargin = 22;  // room for the roofline's label

constexpr std::string_view kStyle = R"(
body { font-family: system-ui, sans-serif; margin: 2em; color: #1d1d1f; max-width: 1100px; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { margin-top: 1.6em; font-family: ui-monospace, monospace; font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.winner td { background: #e7f5e9; font-weight: 600; }
tr.failed td { color: #a33; }
.summary { margin: 0.3em 0; }
.chart text { font: 11px ui-monospace, monospace; fill: #333; }
.chart rect.bar { fill: #7aa6d8; } .chart rect.bar.winner { fill: #2e8b57; }
.chart rect.bar.heuristic { stroke: #333; stroke-width: 1.5; }
.chart line.roofline { stroke: #c0392b; stroke-width: 2; stroke-dasharray: 5 3; }
.chart text.roofline { fill: #c0392b; }
.note { color: #666; font-size: 0.9em; }
)";

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
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

std::string str(const json& value) {
  return escape(value.get<std::string>());
}

std::string td(const std::string& text, bool numeric = false) {
  return numeric ? "<td class=\"num\">" + text + "</td>" : "<td>" + text + "</td>";
}

std::string th_row(std::initializer_list<const char*> names) {
  std::string out = "<tr>";
  for (const char* name : names) out += std::string("<th>") + name + "</th>";
  return out + "</tr>\n";
}

std::string number(double value) {
  return fixed(json(value), 1);
}

// Bars for the ok candidates (failed ones have no bandwidth; the table lists them).
std::string chart(const json& result, const json& copy_gbs) {
  std::vector<const json*> bars;
  double top = 0;
  for (const json& c : result.at("candidates")) {
    if (!c.at("achieved_gbs").is_number()) continue;
    bars.push_back(&c);
    top = std::max(top, c.at("achieved_gbs").get<double>());
  }
  if (bars.empty()) return "<p class=\"note\">No candidate ran successfully: no chart.</p>\n";
  if (copy_gbs.is_number()) top = std::max(top, copy_gbs.get<double>());
  top *= 1.05;
  const int plot_width = kChartWidth - kLabelWidth - kValueWidth;
  const int height = kTopMargin + static_cast<int>(bars.size()) * (kBarHeight + kBarGap) + 4;
  auto x_of = [&](double gbs) { return kLabelWidth + gbs / top * plot_width; };

  std::string out = "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(kChartWidth) + "\" height=\"" + std::to_string(height) +
                    "\" viewBox=\"0 0 " + std::to_string(kChartWidth) + " " +
                    std::to_string(height) + "\" role=\"img\">";
  out += "<title>Achieved bandwidth per candidate, GB/s</title>\n";
  int y = kTopMargin;
  for (const json* c : bars) {
    const double gbs = c->at("achieved_gbs").get<double>();
    std::string cls = "bar";
    if (c->at("is_winner").get<bool>()) cls += " winner";
    if (c->at("is_heuristic").get<bool>()) cls += " heuristic";
    out += "<text x=\"" + std::to_string(kLabelWidth - 6) + "\" y=\"" +
           std::to_string(y + kBarHeight - 4) + "\" text-anchor=\"end\">" + str(c->at("config")) +
           "</text>";
    out += "<rect class=\"" + cls + "\" x=\"" + std::to_string(kLabelWidth) + "\" y=\"" +
           std::to_string(y) + "\" width=\"" + number(x_of(gbs) - kLabelWidth) + "\" height=\"" +
           std::to_string(kBarHeight) + "\" data-gbs=\"" + number(gbs) + "\"><title>" +
           str(c->at("config")) + ": " + number(gbs) + " GB/s</title></rect>";
    out += "<text x=\"" + number(x_of(gbs) + 4) + "\" y=\"" + std::to_string(y + kBarHeight - 4) +
           "\">" + number(gbs) + "</text>\n";
    y += kBarHeight + kBarGap;
  }
  if (copy_gbs.is_number()) {
    const std::string x = number(x_of(copy_gbs.get<double>()));
    out += "<line class=\"roofline\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" +
           std::to_string(kTopMargin - 6) + "\" y2=\"" + std::to_string(height) + "\" data-gbs=\"" +
           number(copy_gbs.get<double>()) + "\"></line>";
    out += "<text class=\"roofline\" x=\"" + x + "\" y=\"12\" text-anchor=\"end\">copy " +
           number(copy_gbs.get<double>()) + " GB/s</text>\n";
  }
  return out + "</svg>\n";
}

void render_result(std::string& out, const json& result) {
  const json& copy_gbs = result.at("copy_bandwidth_gbs");
  out += "<section class=\"result\">\n<h3>" + str(result.at("problem_key")) + ", " +
         escape(detail::bucket_label(result)) + "</h3>\n";
  out += "<p class=\"summary\">mode " + str(result.at("mode")) + "; winner <code>" +
         str(result.at("winner")) + "</code>" +
         (result.value("pinned", false) ? " <span class=\"pinned\">(pinned)</span>" : "") + " (" +
         fixed(result.at("winner_median_us"), 2) + " us, " + fixed(result.at("winner_gbs"), 1) +
         " GB/s); heuristic <code>" + str(result.at("heuristic")) + "</code> (" +
         fixed(result.at("heuristic_median_us"), 2) +
         " us); speedup over the heuristic <strong class=\"speedup\">" +
         times(result.at("speedup_over_heuristic")) + "</strong>; tuned in " +
         fixed(result.at("tune_ms"), 0) + " ms.</p>\n";
  if (!result.at("reason").get<std::string>().empty()) {
    out += "<p class=\"note\">" + str(result.at("reason")) + "</p>\n";
  }
  if (result.at("candidates").empty()) {
    out += "<p class=\"note\">No candidates measured.</p>\n</section>\n";
    return;
  }
  if (!copy_gbs.is_number()) {
    out += "<p class=\"note\">No measured copy bandwidth recorded: no roofline.</p>\n";
  }
  out += chart(result, copy_gbs);
  out += "<table class=\"candidates\">\n";
  out += th_row(
      {"config", "status", "median us", "spread us", "GB/s", "% of copy", "compile ms", "note"});
  for (const json& c : result.at("candidates")) {
    std::string cls;
    if (c.at("is_winner").get<bool>()) cls = "winner";
    if (c.at("status").get<std::string>() != "ok") cls = "failed";
    std::string note;
    if (c.at("is_winner").get<bool>()) note += "winner";
    if (c.at("is_heuristic").get<bool>()) note += note.empty() ? "heuristic" : ", heuristic";
    if (!c.at("message").get<std::string>().empty()) {
      note += (note.empty() ? "" : "; ") + c.at("message").get<std::string>();
    }
    out += cls.empty() ? "<tr>" : "<tr class=\"" + cls + "\">";
    out += td("<code>" + str(c.at("config")) + "</code>") + td(str(c.at("status"))) +
           td(fixed(c.at("median_us"), 2), true) + td(fixed(c.at("spread_us"), 2), true) +
           td(fixed(c.at("achieved_gbs"), 1), true) + td(fixed(c.at("percent_of_copy"), 1), true) +
           td(fixed(c.at("compile_ms"), 0), true) + td(escape(note)) + "</tr>\n";
  }
  out += "</table>\n</section>\n";
}

void render_devices(std::string& out, const json& devices) {
  out += "<h2>Devices</h2>\n<table class=\"devices\">\n";
  out += th_row({"device", "name", "SMs", "driver", "NVRTC", "copy bandwidth", "datasheet",
                 "results", "tuning ms"});
  for (const json& d : devices) {
    const json& copy = d.at("copy_bandwidth_gbs");
    const json& datasheet = d.at("datasheet_bandwidth_gbs");
    out +=
        "<tr>" + td(str(d.at("device"))) + td(str(d.at("name"))) +
        td(d.at("sm_count").is_number() ? std::to_string(d.at("sm_count").get<int>()) : "unknown",
           true) +
        td(escape(text_or_unknown(d.at("driver")))) + td(escape(text_or_unknown(d.at("nvrtc")))) +
        td(copy.is_number() ? fixed(copy, 0) + " GB/s" : "not recorded", true) +
        td(datasheet.is_number() ? fixed(datasheet, 0) + " GB/s" : "unknown", true) +
        td(std::to_string(d.at("results").size()), true) +
        td(fixed(d.at("total_tune_ms"), 0), true) + "</tr>\n";
  }
  out += "</table>\n";
}

}  // namespace

std::string render_html(const json& model) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>kiln autotune report</title>\n<style>";
  out += kStyle;
  out += "</style>\n</head>\n<body>\n<h1>kiln autotune report</h1>\n";
  out += "<p class=\"summary\">" + std::to_string(model.at("total_results").get<std::int64_t>()) +
         " tuning results, " + fixed(model.at("total_tune_ms"), 0) + " ms of tuning in all.</p>\n";
  if (!model.at("devices").empty()) render_devices(out, model.at("devices"));
  for (const json& d : model.at("devices")) {
    out += "<section class=\"device\">\n<h2>" + str(d.at("name")) + " (" + str(d.at("device")) +
           ")</h2>\n";
    for (const json& result : d.at("results")) {
      render_result(out, result);
    }
    out += "</section>\n";
  }
  if (!model.at("skipped").empty()) {
    out += "<h2>Skipped documents</h2>\n<table class=\"skipped\">\n";
    out += th_row({"device", "problem", "bucket", "reason"});
    for (const json& s : model.at("skipped")) {
      out += "<tr>" + td(str(s.at("device"))) + td(str(s.at("problem"))) +
             td(std::to_string(s.at("bucket").get<std::int64_t>()), true) +
             td(str(s.at("reason"))) + "</tr>\n";
    }
    out += "</table>\n";
  }
  return out + "</body>\n</html>\n";
}

}  // namespace kiln::report

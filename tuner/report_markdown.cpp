// The report as Markdown: a table of devices, then per (problem, bucket) a summary line and a
// table of every candidate.
#include <string>

#include "tuner/report.h"
#include "tuner/report_text.h"

namespace kiln::report {
namespace {

using detail::fixed;
using detail::text_or_unknown;
using detail::times;
using nlohmann::json;

// A table cell: pipes would end the cell and newlines the row.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string row(std::initializer_list<std::string> cells) {
  std::string line = "|";
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on " " + std::string.
  for (const auto& text : cells) {
    line += ' ';
    line += cell(text);
    line += " |";
  }
  return line + "\n";
}

std::string integer_or_unknown(const json& value) {
  return value.is_number_integer() ? std::to_string(value.get<std::int64_t>()) : "unknown";
}

std::string copy_bandwidth(const json& device) {
  const json& copy = device.at("copy_bandwidth_gbs");
  return copy.is_number() ? fixed(copy, 0) + " GB/s" : "not recorded";
}

void render_result(std::string& out, const json& result) {
  out += "### " + result.at("problem_key").get<std::string>() + ", " +
         detail::bucket_label(result) + "\n\n";
  out += "mode " + result.at("mode").get<std::string>() + "; winner `" +
         result.at("winner").get<std::string>() + "`" +
         (result.value("pinned", false) ? " (pinned)" : "") + " (" +
         fixed(result.at("winner_median_us"), 2) + " us, " + fixed(result.at("winner_gbs"), 1) +
         " GB/s); heuristic `" + result.at("heuristic").get<std::string>() + "` (" +
         fixed(result.at("heuristic_median_us"), 2) + " us); speedup over the heuristic " +
         times(result.at("speedup_over_heuristic")) + "; tuned in " +
         fixed(result.at("tune_ms"), 0) + " ms; " +
         std::to_string(result.at("bytes_moved").get<std::int64_t>()) + " bytes moved\n\n";
  if (!result.at("reason").get<std::string>().empty()) {
    out += cell(result.at("reason").get<std::string>()) + "\n\n";
  }
  if (result.at("candidates").empty()) {
    out += "(no candidates measured)\n\n";
    return;
  }
  out += row(
      {"config", "status", "median us", "spread us", "GB/s", "% of copy", "compile ms", "note"});
  out += "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n";
  for (const json& c : result.at("candidates")) {
    std::string note;
    if (c.at("is_winner").get<bool>()) note += "winner";
    if (c.at("is_heuristic").get<bool>()) note += note.empty() ? "heuristic" : ", heuristic";
    const std::string message = c.at("message").get<std::string>();
    if (!message.empty()) note += (note.empty() ? "" : "; ") + message;
    std::string config = "`";
    config += c.at("config").get<std::string>();
    config += '`';
    out += row({config, c.at("status").get<std::string>(), fixed(c.at("median_us"), 2),
                fixed(c.at("spread_us"), 2), fixed(c.at("achieved_gbs"), 1),
                fixed(c.at("percent_of_copy"), 1), fixed(c.at("compile_ms"), 0), note});
  }
  out += "\n";
}

}  // namespace

std::string render_markdown(const json& model) {
  std::string out = "# kiln autotune report\n\n";
  out += std::to_string(model.at("total_results").get<std::int64_t>()) + " tuning results, " +
         fixed(model.at("total_tune_ms"), 0) + " ms of tuning in all.\n\n";
  if (!model.at("devices").empty()) {
    out += "## Devices\n\n";
    out += row({"device", "name", "SMs", "driver", "NVRTC", "copy bandwidth", "datasheet",
                "results", "tuning ms"});
    out += "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |\n";
    for (const json& d : model.at("devices")) {
      out += row({d.at("device").get<std::string>(), d.at("name").get<std::string>(),
                  integer_or_unknown(d.at("sm_count")), text_or_unknown(d.at("driver")),
                  text_or_unknown(d.at("nvrtc")), copy_bandwidth(d),
                  d.at("datasheet_bandwidth_gbs").is_number()
                      ? fixed(d.at("datasheet_bandwidth_gbs"), 0) + " GB/s"
                      : "unknown",
                  std::to_string(d.at("results").size()), fixed(d.at("total_tune_ms"), 0)});
    }
    out += "\n";
  }
  for (const json& d : model.at("devices")) {
    out += "## " + d.at("name").get<std::string>() + " (" + d.at("device").get<std::string>() +
           ")\n\n";
    for (const json& result : d.at("results")) render_result(out, result);
  }
  if (!model.at("skipped").empty()) {
    out += "## Skipped documents\n\n";
    out += row({"device", "problem", "bucket", "reason"});
    out += "| --- | --- | ---: | --- |\n";
    for (const json& s : model.at("skipped")) {
      out += row({s.at("device").get<std::string>(), s.at("problem").get<std::string>(),
                  std::to_string(s.at("bucket").get<std::int64_t>()),
                  s.at("reason").get<std::string>()});
    }
    out += "\n";
  }
  return out;
}

}  // namespace kiln::report

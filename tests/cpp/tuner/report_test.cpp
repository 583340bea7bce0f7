#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cache/error.h"
#include "report_fixture.h"
#include "templates/family.h"
#include "tuner/report.h"

namespace kiln {
namespace {

using nlohmann::json;
using testing::fixture_documents;

const json& device_named(const json& model, const std::string& name) {
  for (const json& d : model.at("devices")) {
    if (d.at("name") == name) return d;
  }
  FAIL("no device " << name);
  static const json none;
  return none;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

void check_type(const json& object, const char* key, json::value_t type, bool nullable = false) {
  INFO("key " << key);
  REQUIRE(object.contains(key));
  const auto actual = object.at(key).type();
  const bool numbers =
      type == json::value_t::number_float &&
      (actual == json::value_t::number_integer || actual == json::value_t::number_unsigned);
  const bool integers =
      type == json::value_t::number_integer && actual == json::value_t::number_unsigned;
  CHECK((actual == type || numbers || integers || (nullable && object.at(key).is_null())));
}

TEST_CASE("report model: schema keys and types") {
  const json model = report::build(fixture_documents(), {});
  using t = json::value_t;
  CHECK(model.at("schema") == "kiln.report");
  CHECK(model.at("version") == report::kSchemaVersion);
  check_type(model, "total_tune_ms", t::number_float);
  check_type(model, "total_results", t::number_integer);
  check_type(model, "devices", t::array);
  check_type(model, "skipped", t::array);
  REQUIRE(model.at("devices").size() == 2);
  for (const json& d : model.at("devices")) {
    for (const char* key : {"device", "fingerprint", "name"}) check_type(d, key, t::string);
    for (const char* key : {"driver", "nvrtc", "kiln"}) check_type(d, key, t::string, true);
    for (const char* key : {"sm", "sm_count", "memory_bytes"}) {
      check_type(d, key, t::number_integer, true);
    }
    check_type(d, "datasheet_bandwidth_gbs", t::number_float, true);
    check_type(d, "copy_bandwidth_gbs", t::number_float, true);
    check_type(d, "total_tune_ms", t::number_float);
    for (const json& r : d.at("results")) {
      for (const char* key : {"problem_key", "op", "mode", "heuristic", "winner", "reason"}) {
        check_type(r, key, t::string);
      }
      check_type(r, "problem", t::object);
      check_type(r, "bucket_rows", t::number_integer);
      check_type(r, "rows", t::number_integer);
      check_type(r, "bytes_moved", t::number_integer);
      for (const char* key : {"tune_ms", "winner_median_us", "heuristic_median_us", "winner_gbs",
                              "speedup_over_heuristic", "copy_bandwidth_gbs"}) {
        check_type(r, key, t::number_float, true);
      }
      for (const json& c : r.at("candidates")) {
        for (const char* key : {"config", "status", "message"}) check_type(c, key, t::string);
        check_type(c, "config_fields", t::object);
        check_type(c, "repetitions", t::number_integer);
        for (const char* key :
             {"median_us", "spread_us", "compile_ms", "achieved_gbs", "percent_of_copy"}) {
          check_type(c, key, t::number_float, true);
        }
        check_type(c, "is_winner", t::boolean);
        check_type(c, "is_heuristic", t::boolean);
      }
    }
  }
}

TEST_CASE("report model: bandwidth, % of copy and speedup are computed from the measurements") {
  const json model = report::build(fixture_documents(), {});
  const json& h100 = device_named(model, "NVIDIA H100 80GB HBM3");
  CHECK(h100.at("sm_count") == 132);
  CHECK(h100.at("driver") == "13.0");
  CHECK(h100.at("nvrtc") == "12.8");
  CHECK(h100.at("copy_bandwidth_gbs").get<double>() == doctest::Approx(3000.0));
  CHECK(h100.at("total_tune_ms").get<double>() == doctest::Approx(1200.0));
  REQUIRE(h100.at("results").size() == 2);
  const json& rms = h100.at("results")[0];
  REQUIRE(rms.at("op") == "rms_norm");
  // RMSNorm bf16, 4096 rows of 4096 with a weight: x read, y written, the weight read once.
  const std::int64_t bytes = 2 * (4096LL * 4096 * 2 + 4096);
  CHECK(rms.at("bytes_moved") == bytes);
  CHECK(rms.at("bytes_moved") ==
        family(Op::rms_norm).bytes_moved(testing::rms_norm_problem(), 4096));
  const json& candidates = rms.at("candidates");
  REQUIRE(candidates.size() == 5);
  const double winner_gbs = bytes / 32.0e-6 / 1e9;
  CHECK(candidates[1].at("achieved_gbs").get<double>() == doctest::Approx(winner_gbs));
  CHECK(candidates[1].at("percent_of_copy").get<double>() ==
        doctest::Approx(100.0 * winner_gbs / 3000.0));
  CHECK(candidates[1].at("is_winner") == true);
  CHECK(candidates[0].at("is_heuristic") == true);
  CHECK(candidates[0].at("achieved_gbs").get<double>() == doctest::Approx(bytes / 40.0e-6 / 1e9));
  CHECK(rms.at("winner_gbs").get<double>() == doctest::Approx(winner_gbs));
  CHECK(rms.at("speedup_over_heuristic").get<double>() == doctest::Approx(40.0 / 32.0));
  // Failed candidates have no bandwidth, but keep their compile time and message.
  CHECK(candidates[3].at("status") == "resource_error");
  CHECK(candidates[3].at("achieved_gbs").is_null());
  CHECK(candidates[3].at("percent_of_copy").is_null());
  CHECK(candidates[3].at("compile_ms").get<double>() == doctest::Approx(90));
  CHECK(candidates[4].at("status") == "wrong_result");

  const json& swiglu = h100.at("results")[1];
  CHECK(swiglu.at("op") == "swiglu");
  CHECK(swiglu.at("speedup_over_heuristic").get<double>() == doctest::Approx(1.0));
  // Timed on 1000 rows of its 1024-row bucket: gate and up read, out written, three
  // [1000, 4096] bf16 tensors.
  CHECK(swiglu.at("bucket_rows") == 1024);
  CHECK(swiglu.at("rows") == 1000);
  CHECK(swiglu.at("bytes_moved") == 3LL * 1000 * 4096 * 2);
  // A result with rows 0 (mode off times nothing) counts its bucket's.
  CHECK(rms.at("rows") == 4096);
}

TEST_CASE("report model: no copy bandwidth recorded means no percentage, and mode off has none") {
  const json model = report::build(fixture_documents(), {});
  const json& h200 = device_named(model, "NVIDIA H200");
  CHECK(h200.at("copy_bandwidth_gbs").is_null());
  CHECK(h200.at("datasheet_bandwidth_gbs").get<double>() == doctest::Approx(3352.3));
  REQUIRE(h200.at("results").size() == 2);
  const json& off = h200.at("results")[0];  // bucket 1 sorts first
  CHECK(off.at("mode") == "off");
  CHECK(off.at("candidates").empty());
  CHECK(off.at("speedup_over_heuristic").is_null());
  const json& tuned = h200.at("results")[1];
  CHECK(tuned.at("candidates")[1].at("achieved_gbs").is_number());
  CHECK(tuned.at("candidates")[1].at("percent_of_copy").is_null());
  CHECK(model.at("total_results") == 4);
  CHECK(model.at("total_tune_ms").get<double>() == doctest::Approx(900 + 300 + 900 + 0));
}

TEST_CASE("report model: prewarm records and damaged files are listed as skipped") {
  const json model = report::build(fixture_documents(), {});
  REQUIRE(model.at("skipped").size() == 2);
  CHECK(model.at("skipped")[0].at("reason").get<std::string>().find("prewarm") !=
        std::string::npos);
  CHECK(model.at("skipped")[1].at("reason") == "not a JSON object");
  // A document whose problem names no known op is skipped with the reader's reason.
  auto docs = fixture_documents();
  docs[0].document["problem"]["op"] = "no_such_op";
  const json damaged = report::build(docs, {});
  CHECK(damaged.at("total_results") == 3);
  CHECK(damaged.at("skipped").size() == 3);
}

TEST_CASE("report model: filters by device and op") {
  const auto docs = fixture_documents();
  const json h200 = report::build(docs, {"h200", ""});
  REQUIRE(h200.at("devices").size() == 1);
  CHECK(h200.at("devices")[0].at("name") == "NVIDIA H200");
  const json by_folder = report::build(docs, {"NVIDIA_H100_80GB_HBM3.sm90.132sm.80GiB", ""});
  REQUIRE(by_folder.at("devices").size() == 1);
  CHECK(by_folder.at("devices")[0].at("name") == "NVIDIA H100 80GB HBM3");
  const json swiglu = report::build(docs, {"", "swiglu"});
  CHECK(swiglu.at("total_results") == 1);
  CHECK(swiglu.at("devices").size() == 1);
  CHECK(report::build(docs, {"A100", ""}).at("devices").empty());
  CHECK_THROWS_AS(report::build(docs, {"", "rmsnorm"}), ArgumentError);
}

TEST_CASE("report markdown: one table row per candidate, escaped cells") {
  const std::string md = report::render_markdown(report::build(fixture_documents(), {}));
  CHECK(md.starts_with("# kiln autotune report\n"));
  CHECK(count(md, "| config | status | median us |") == 3);  // three results with candidates
  CHECK(count(md, "| `v16.t64.c256` | ok |") == 3);
  CHECK(md.find("| `v16.t64.c256` | ok | 32.00 | 0.20 | 2097.4 | 69.9 | 130 | winner |") !=
        std::string::npos);
  CHECK(md.find("| `v16.t32.c128` | ok | 40.00 | 0.40 | 1677.9 | 55.9 | 120 | heuristic |") !=
        std::string::npos);
  CHECK(md.find("too many registers \\| <spill>") != std::string::npos);
  CHECK(md.find("speedup over the heuristic 1.25x") != std::string::npos);
  CHECK(md.find(
            "| NVIDIA_H200.sm90.132sm.141GiB | NVIDIA H200 | 132 | 13.0 | 12.8 | not recorded |") !=
        std::string::npos);
  CHECK(md.find("## Skipped documents") != std::string::npos);
  CHECK(count(md, "rows <= 1024 (timed on 1000)") == 1);
  CHECK(count(md, "rows <= 4096\n") == 2);
}

// Every element opened is closed in order (the renderer writes no implicit closes), so a
// stack of names checks well-formedness; <meta> and <!DOCTYPE> are the only void tags.
bool balanced(const std::string& html, std::string& why) {
  std::vector<std::string> stack;
  for (std::size_t at = html.find('<'); at != std::string::npos; at = html.find('<', at + 1)) {
    const std::size_t end = html.find('>', at);
    if (end == std::string::npos) {
      why = "unterminated tag";
      return false;
    }
    std::string tag = html.substr(at + 1, end - at - 1);
    if (tag.starts_with("!")) continue;
    const bool closing = tag.starts_with("/");
    if (closing) tag.erase(0, 1);
    tag = tag.substr(0, tag.find_first_of(" \n"));
    if (tag == "meta") continue;
    if (!closing) {
      stack.push_back(tag);
    } else if (stack.empty() || stack.back() != tag) {
      why = "</" + tag + "> closes " + (stack.empty() ? "nothing" : stack.back());
      return false;
    } else {
      stack.pop_back();
    }
  }
  why = stack.empty() ? "" : "unclosed " + stack.back();
  return stack.empty();
}

TEST_CASE("report html: well formed, self-contained, a chart per measured problem") {
  auto docs = fixture_documents();
  docs[0].document["trials"][2]["message"] = "<script>alert(1)</script> & more";
  const std::string html = report::render_html(report::build(docs, {}));
  std::string why;
  CHECK_MESSAGE(balanced(html, why), why);
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; more") != std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // the SVG namespace only
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find(" src=") == std::string::npos);
  CHECK(count(html, "<svg class=\"chart\"") == 3);
  // 3 + 2 + 3 ok candidates, one bar each; the winners are marked.
  CHECK(count(html, "<rect class=\"bar") == 8);
  CHECK(count(html, "<rect class=\"bar winner") == 3);
  // The roofline only where the copy bandwidth was measured (the two H100 results).
  CHECK(count(html, "<line class=\"roofline\"") == 2);
  CHECK(html.find("data-gbs=\"3000.0\"") != std::string::npos);
  CHECK(html.find("data-gbs=\"2097.4\"") != std::string::npos);
  CHECK(count(html, "No measured copy bandwidth recorded") == 1);
}

TEST_CASE("report render: formats") {
  CHECK(report::parse_format("json") == report::Format::json);
  CHECK(report::parse_format("md") == report::Format::markdown);
  CHECK(report::parse_format("html") == report::Format::html);
  CHECK_FALSE(report::parse_format("pdf"));
  const json model = report::build(fixture_documents(), {});
  CHECK(json::parse(report::render(model, report::Format::json)) == model);
}

}  // namespace
}  // namespace kiln

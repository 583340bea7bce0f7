// The autotune report (`kiln report`, kiln.report): what the tuning database holds, per
// device and per (problem, row bucket), with every candidate's measurements turned into
// achieved bandwidth. No CUDA and no file access: it takes documents already read.
//
// The report is first built as a JSON model (schema below, "version" 1); Markdown and HTML
// are renderings of that model, so every number is computed once.
//
//   {"schema": "kiln.report", "version": 1,
//    "filter": {"device": str|null, "op": str|null},
//    "total_tune_ms": num, "total_results": int,
//    "devices": [{
//      "device": str (the database folder), "fingerprint": str, "name": str,
//      "sm": int|null, "sm_count": int|null, "memory_bytes": int|null,
//      "driver": str|null, "nvrtc": str|null, "kiln": str|null   (distinct values, ", "-joined),
//      "datasheet_bandwidth_gbs": num|null,
//      "copy_bandwidth_gbs": num|null      (measured copy bandwidth; null: not recorded),
//      "total_tune_ms": num,
//      "results": [{
//        "problem_key": str, "problem": {...Problem JSON}, "op": str, "bucket_rows": int,
//        "rows": int                         (the rows the candidates were timed on),
//        "mode": "off"|"fast"|"full", "bytes_moved": int (over those rows),
//        "copy_bandwidth_gbs": num|null      (recorded with this result),
//        "heuristic": str, "winner": str (config keys), "reason": str, "tune_ms": num|null,
//        "winner_median_us": num|null, "heuristic_median_us": num|null,
//        "winner_gbs": num|null, "speedup_over_heuristic": num|null,
//        "pinned": bool                      (kept whatever the versions; `kiln tune pin`),
//        "candidates": [{
//          "config": str, "config_fields": {...Config JSON}, "status": str,
//          "median_us": num|null, "spread_us": num|null, "compile_ms": num|null,
//          "repetitions": int, "message": str,
//          "achieved_gbs": num|null, "percent_of_copy": num|null,
//          "is_winner": bool, "is_heuristic": bool}]}]}],
//    "skipped": [{"device": str, "problem": str, "bucket": int, "reason": str}]}
//
// achieved_gbs = bytes_moved(problem, rows) / median (GB/s, 1e9 bytes);
// percent_of_copy = 100 * achieved_gbs / copy_bandwidth_gbs;
// speedup_over_heuristic = heuristic median / winner median (both ok trials).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::report {

inline constexpr int kSchemaVersion = 1;

// One file of the tuning database as read from disk.
struct StoredDocument {
  std::string device;   // folder name (the sanitised device fingerprint)
  std::string problem;  // problem key from the file name
  std::int64_t bucket = 0;
  nlohmann::json document;  // discarded (is_discarded()) when the file did not parse
};

struct Filter {
  std::string device;  // empty: all; else the folder, the fingerprint, or part of the name
  std::string op;      // empty: all; else an op name (checked: unknown names throw)
};

enum class Format : std::uint8_t { json, markdown, html };
std::optional<Format> parse_format(std::string_view text);  // "json", "md"/"markdown", "html"

// Whether a stored document belongs to the device `wanted` names (see Filter::device).
bool device_matches(const StoredDocument& stored, std::string_view wanted);

// The JSON model. Documents that are not tuning results (prewarm records, unreadable or
// malformed ones) are listed under "skipped" with the reason.
nlohmann::json build(const std::vector<StoredDocument>& documents, const Filter& filter);

std::string render_markdown(const nlohmann::json& model);
std::string render_html(const nlohmann::json& model);
std::string render(const nlohmann::json& model, Format format);

}  // namespace kiln::report

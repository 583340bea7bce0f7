#include "tuner/report_text.h"

#include <cstdio>

namespace kiln::report::detail {

std::string fixed(const nlohmann::json& value, int decimals) {
  if (!value.is_number()) return "–";
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value.get<double>());
  return text;
}

std::string times(const nlohmann::json& value) {
  return value.is_number() ? fixed(value, 2) + "x" : "–";
}

std::string text_or_unknown(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : "unknown";
}

std::string bucket_label(const nlohmann::json& result) {
  const auto bucket = result.at("bucket_rows").get<std::int64_t>();
  const auto rows = result.at("rows").get<std::int64_t>();
  return "rows <= " + std::to_string(bucket) +
         (rows == bucket ? "" : " (timed on " + std::to_string(rows) + ")");
}

}  // namespace kiln::report::detail

// Number and text formatting shared by the report's Markdown and HTML renderings.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kiln::report::detail {

// `value` (a JSON number or null) with `decimals` places, or "–" when null.
std::string fixed(const nlohmann::json& value, int decimals);
// "1.23x" or "–".
std::string times(const nlohmann::json& value);
// A JSON string or null as text ("unknown" for null).
std::string text_or_unknown(const nlohmann::json& value);
// "rows <= 4096" style bucket label.
std::string bucket_label(const nlohmann::json& result);

}  // namespace kiln::report::detail

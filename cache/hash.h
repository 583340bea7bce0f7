// Content keys: XXH3-128 over length-prefixed parts, as 32 hex digits. Length prefixes make
// ("ab","c") and ("a","bc") different keys. Never keyed on names or file times.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace kiln {

std::string content_key(std::initializer_list<std::string_view> parts);
std::string content_key(std::span<const std::string_view> parts);
// XXH3-64 of a byte range, for entry checksums.
std::uint64_t checksum64(std::span<const char> bytes);

}  // namespace kiln

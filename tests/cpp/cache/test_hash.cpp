#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/hash.h"

namespace {

bool is_lower_hex(const std::string& text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The documented key, computed independently with XXH3's one-shot API: each part preceded by
// its length as 8 little-endian bytes, the 128-bit hash printed big-endian (as xxhsum does).
std::string reference_key(const std::vector<std::string>& parts) {
  std::string text;
  for (const auto& part : parts) {
    std::uint64_t size = part.size();
    for (int i = 0; i < 8; ++i) text.push_back(static_cast<char>((size >> (8 * i)) & 0xFF));
    text += part;
  }
  XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
  char out[33];
  std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(hash.high64),
                static_cast<unsigned long long>(hash.low64));
  return out;
}

}  // namespace

TEST_CASE("content_key is 32 lowercase hex digits and deterministic") {
  auto key = kiln::content_key({"kernel source", "-arch=sm_90", "13.0"});
  CHECK(key.size() == 32);
  CHECK(is_lower_hex(key));
  CHECK(key == kiln::content_key({"kernel source", "-arch=sm_90", "13.0"}));
}

TEST_CASE("content_key matches XXH3-128 over length-prefixed parts") {
  CHECK(kiln::content_key({"abc"}) == reference_key({"abc"}));
  CHECK(kiln::content_key({"a", "", "bc"}) == reference_key({"a", "", "bc"}));
  CHECK(kiln::content_key({}) == reference_key({}));
  std::string big(100000, 'x');
  big[777] = 'y';
  CHECK(kiln::content_key({big, "tail"}) == reference_key({big, "tail"}));
}

TEST_CASE("content_key separates parts") {
  CHECK(kiln::content_key({"ab", "c"}) != kiln::content_key({"a", "bc"}));
  CHECK(kiln::content_key({"abc"}) != kiln::content_key({"ab", "c"}));
  CHECK(kiln::content_key({}) != kiln::content_key({""}));
  CHECK(kiln::content_key({""}) != kiln::content_key({"", ""}));
  CHECK(kiln::content_key({"sm_80"}) != kiln::content_key({"sm_90"}));
  CHECK(kiln::content_key({"x", "y"}) != kiln::content_key({"y", "x"}));
}

TEST_CASE("content_key over a span equals the initializer-list form") {
  std::array<std::string_view, 3> parts = {"src", "name<4096>", "-O3"};
  CHECK(kiln::content_key(std::span<const std::string_view>(parts)) ==
        kiln::content_key({"src", "name<4096>", "-O3"}));
}

TEST_CASE("checksum64 is XXH3-64 and changes with any flipped bit") {
  std::vector<char> bytes(257);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + 7);
  auto base = kiln::checksum64(bytes);
  CHECK(base == XXH3_64bits(bytes.data(), bytes.size()));
  for (std::size_t i = 0; i < bytes.size(); i += 37) {
    for (int bit = 0; bit < 8; bit += 3) {
      auto flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      CHECK(kiln::checksum64(flipped) != base);
    }
  }
  CHECK(kiln::checksum64(std::span<const char>(bytes).first(256)) != base);
}

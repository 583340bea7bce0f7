// XXH3 is used as a library (xxhash.h, inlined) rather than a hand-written hash, so keys match
// any other XXH3 implementation over the same bytes.
#include "cache/hash.h"

#include <array>
#include <cstddef>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kiln {
namespace {

// Each part is preceded by its length as 8 little-endian bytes, so part boundaries are part of
// the hashed text: ("ab","c") and ("a","bc") differ.
void update_with_part(XXH3_state_t& state, std::string_view part) {
  std::array<unsigned char, 8> length{};
  auto size = static_cast<std::uint64_t>(part.size());
  for (std::size_t i = 0; i < length.size(); ++i) {
    length[i] = static_cast<unsigned char>(size >> (8 * i));
  }
  XXH3_128bits_update(&state, length.data(), length.size());
  XXH3_128bits_update(&state, part.data(), part.size());
}

// The canonical (big-endian) form, so the text reads the same as xxhsum's.
std::string to_hex(XXH128_hash_t hash) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * sizeof(canonical.digest));
  for (unsigned char byte : canonical.digest) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 0xF]);
  }
  return text;
}

template <typename Parts>
std::string key_of(const Parts& parts) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  for (std::string_view part : parts) update_with_part(state, part);
  return to_hex(XXH3_128bits_digest(&state));
}

}  // namespace

std::string content_key(std::initializer_list<std::string_view> parts) {
  return key_of(parts);
}

std::string content_key(std::span<const std::string_view> parts) {
  return key_of(parts);
}

std::uint64_t checksum64(std::span<const char> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace kiln

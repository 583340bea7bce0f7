// The on-disk layout of a binary store entry (internal to cache/). All fields little-endian,
// written byte by byte so the layout does not depend on the compiler's struct packing:
//   8 bytes  magic "KILNBIN\0"
//   u32      format version (BinaryStore::kFormatVersion)
//   u32      key length, then the key bytes (echoed, so a file under the wrong name is caught)
//   u64      payload length
//   u64      XXH3-64 checksum of the payload
//   payload
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

namespace kiln::detail {

inline constexpr std::string_view kEntryMagic{"KILNBIN\0", 8};

std::vector<char> encode_entry(std::string_view key, std::span<const char> payload);

struct EntryCheck {
  const char* problem = nullptr;  // why the bytes are not a valid entry; null when they are
  std::size_t payload_offset = 0;
  bool ok() const { return problem == nullptr; }
};

// Validates `bytes` as the entry for `key`.
EntryCheck check_entry(std::span<const char> bytes, std::string_view key);

}  // namespace kiln::detail

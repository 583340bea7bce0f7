#include "cache/entry_format.h"

#include <cstdint>
#include <cstring>

#include "cache/binary_store.h"
#include "cache/hash.h"

namespace kiln::detail {
namespace {

template <typename T>
char* put(char* out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    *out++ = static_cast<char>(static_cast<unsigned char>(value >> (8 * i)));
  }
  return out;
}

char* put_bytes(char* out, std::span<const char> bytes) {
  return bytes.empty()
             ? out
             : static_cast<char*>(std::memcpy(out, bytes.data(), bytes.size())) + bytes.size();
}

template <typename T>
T get(std::span<const char> bytes, std::size_t offset) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::vector<char> encode_entry(std::string_view key, std::span<const char> payload) {
  std::vector<char> out(kEntryMagic.size() + 4 + 4 + key.size() + 8 + 8 + payload.size());
  char* at = put_bytes(out.data(), kEntryMagic);
  at = put<std::uint32_t>(at, BinaryStore::kFormatVersion);
  at = put<std::uint32_t>(at, static_cast<std::uint32_t>(key.size()));
  at = put_bytes(at, key);
  at = put<std::uint64_t>(at, payload.size());
  at = put<std::uint64_t>(at, checksum64(payload));
  put_bytes(at, payload);
  return out;
}

EntryCheck check_entry(std::span<const char> bytes, std::string_view key) {
  constexpr std::size_t kFixed = 8 + 4 + 4;
  if (bytes.empty()) return {"empty file"};
  if (bytes.size() < kFixed) return {"truncated header"};
  if (std::string_view(bytes.data(), kEntryMagic.size()) != kEntryMagic) return {"bad magic"};
  if (get<std::uint32_t>(bytes, 8) != BinaryStore::kFormatVersion) {
    return {"other format version"};
  }
  std::uint64_t key_length = get<std::uint32_t>(bytes, 12);
  if (bytes.size() - kFixed < key_length + 16) return {"truncated header"};
  if (std::string_view(bytes.data() + kFixed, key_length) != key) return {"key mismatch"};
  std::size_t offset = kFixed + key_length;
  std::uint64_t payload_length = get<std::uint64_t>(bytes, offset);
  std::uint64_t checksum = get<std::uint64_t>(bytes, offset + 8);
  offset += 16;
  if (payload_length != bytes.size() - offset) return {"payload length mismatch"};
  if (checksum64(bytes.subspan(offset)) != checksum) return {"checksum mismatch"};
  return {nullptr, offset};
}

}  // namespace kiln::detail

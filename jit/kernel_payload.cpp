#include "jit/kernel_payload.h"

#include <cstdint>
#include <cstring>

namespace kiln::jit {
namespace {

constexpr char kMagic[4] = {'K', 'L', 'N', 'K'};
constexpr std::uint32_t kLayoutVersion = 1;
constexpr std::size_t kHeaderBytes = 4 + 4 * 4;

void put_u32(std::vector<char>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

std::uint32_t get_u32(const char* bytes) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::vector<char> encode_payload(const KernelPayload& payload) {
  std::vector<char> out(kMagic, kMagic + 4);
  out.reserve(kHeaderBytes + payload.name_expression.size() + payload.lowered_name.size() +
              payload.binary.size());
  put_u32(out, kLayoutVersion);
  put_u32(out, payload.format == BinaryFormat::cubin ? 0u : 1u);
  put_u32(out, static_cast<std::uint32_t>(payload.name_expression.size()));
  put_u32(out, static_cast<std::uint32_t>(payload.lowered_name.size()));
  out.insert(out.end(), payload.name_expression.begin(), payload.name_expression.end());
  out.insert(out.end(), payload.lowered_name.begin(), payload.lowered_name.end());
  out.insert(out.end(), payload.binary.begin(), payload.binary.end());
  return out;
}

std::optional<KernelPayload> decode_payload(std::span<const char> bytes) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 4) != 0) return std::nullopt;
  if (get_u32(bytes.data() + 4) != kLayoutVersion) return std::nullopt;
  const std::uint32_t format = get_u32(bytes.data() + 8);
  const std::size_t expression_size = get_u32(bytes.data() + 12);
  const std::size_t lowered_size = get_u32(bytes.data() + 16);
  if (format > 1 || lowered_size == 0) return std::nullopt;
  if (bytes.size() - kHeaderBytes < expression_size + lowered_size) return std::nullopt;
  const char* cursor = bytes.data() + kHeaderBytes;
  KernelPayload payload;
  payload.format = format == 0 ? BinaryFormat::cubin : BinaryFormat::ptx;
  payload.name_expression.assign(cursor, expression_size);
  cursor += expression_size;
  payload.lowered_name.assign(cursor, lowered_size);
  cursor += lowered_size;
  payload.binary.assign(cursor, bytes.data() + bytes.size());
  if (payload.binary.empty()) return std::nullopt;
  return payload;
}

}  // namespace kiln::jit

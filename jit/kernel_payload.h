// What the binary store holds for a compiled kernel: the binary plus what is needed to use it
// without NVRTC (the lowered name), so a cache hit makes no compile at all.
//
// Layout (little-endian u32s): magic "KLNK", layout version, format (0 cubin, 1 ptx),
// length of the name expression, length of the lowered name, then the name expression, the
// lowered name, and the binary to the end.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "jit/compiler.h"

namespace kiln::jit {

struct KernelPayload {
  BinaryFormat format = BinaryFormat::cubin;
  std::string name_expression;
  std::string lowered_name;
  std::vector<char> binary;
};

std::vector<char> encode_payload(const KernelPayload& payload);
// nullopt when the bytes are not a payload of this layout (truncated, wrong magic, ...).
std::optional<KernelPayload> decode_payload(std::span<const char> bytes);

}  // namespace kiln::jit

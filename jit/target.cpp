#include "jit/target.h"

#include <algorithm>

#include "cache/error.h"

namespace kiln::jit {

std::string_view format_name(BinaryFormat format) {
  return format == BinaryFormat::cubin ? "cubin" : "ptx";
}

CompileTarget choose_target(int sm, BinaryFormat format, std::span<const int> supported,
                            const std::string& nvrtc_version) {
  if (supported.empty()) {
    throw Error("kiln: NVRTC " + nvrtc_version + " reports no supported GPU arch");
  }
  if (std::find(supported.begin(), supported.end(), sm) != supported.end()) {
    return {sm, format, {}};
  }
  const std::string range =
      "sm_" + std::to_string(supported.front()) + " to sm_" + std::to_string(supported.back());
  if (sm < supported.front()) {
    throw Error("kiln: NVRTC " + nvrtc_version + " cannot target sm_" + std::to_string(sm) +
                ": it supports " + range + "; use an older CUDA toolkit's NVRTC (KILN_NVRTC)");
  }
  // The newest arch not newer than the request: its PTX runs on the requested GPU.
  const int fallback = *std::prev(std::upper_bound(supported.begin(), supported.end(), sm));
  return {fallback, BinaryFormat::ptx,
          "sm_" + std::to_string(sm) + " is not a target of NVRTC " + nvrtc_version + " (" + range +
              "): emitting PTX for compute_" + std::to_string(fallback) +
              ", which the driver JIT-compiles at load time"};
}

}  // namespace kiln::jit

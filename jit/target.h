// Which NVRTC target serves a requested GPU arch. NVRTC can only emit code for the archs it
// knows; for a GPU newer than that, PTX for the newest known virtual arch is forward
// compatible and the driver JIT-compiles it at load time.
#pragma once

#include <span>
#include <string>

#include "jit/compiler.h"

namespace kiln::jit {

struct CompileTarget {
  int arch = 0;  // the NVRTC target: sm_<arch> for a cubin, compute_<arch> for PTX
  BinaryFormat format = BinaryFormat::cubin;
  std::string note;  // why the target differs from the request; empty when it does not
};

// `supported`: NVRTC's archs, ascending. Throws kiln::Error when `sm` is older than all of
// them (NVRTC dropped it: no code can be made for that GPU).
CompileTarget choose_target(int sm, BinaryFormat format, std::span<const int> supported,
                            const std::string& nvrtc_version);

std::string_view format_name(BinaryFormat format);  // "cubin" | "ptx"

}  // namespace kiln::jit

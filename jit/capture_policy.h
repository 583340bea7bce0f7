// What a kernel first needed while a CUDA graph is being captured may use (KILN_CAPTURE).
//
// The rule in every mode: no NVRTC compile and no tuning inside a capture. A compile takes
// from a fraction of a second to seconds of host time inside what the user means to be a
// cheap recording, and tuning launches and synchronises, which a capture forbids. Loading a
// module is allowed: the driver permits it on a thread in relaxed capture mode (see
// jit/module.h), and kiln never unloads a module, so a captured launch stays valid for every
// replay.
//
//   heuristic (default)  the kernel comes from the binary store: the tuned config's binary
//                        (tuning result, else prewarm record), else the family's heuristic
//                        for the call's row bucket, else its row-blind heuristic (what older
//                        prewarms left); no binary in the store is an error naming the op and
//                        fix.
//   error                a kernel not already loaded by this process is an error: a capture
//                        uses exactly the kernels a warm-up chose, never a fallback.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "templates/types.h"

namespace kiln::jit {

enum class CaptureMode : unsigned char { heuristic, error };

std::string_view capture_mode_name(CaptureMode mode);
std::optional<CaptureMode> parse_capture_mode(std::string_view text);

// The error a capture raises for a kernel it may not get: names the op, the specialisation
// and row bucket, what is missing (`missing`), and the fixes.
std::string capture_miss_message(const Problem& problem, std::int64_t bucket, int device,
                                 std::string_view missing);

}  // namespace kiln::jit

// The device's measured copy bandwidth: what a plain device-to-device copy of a large buffer
// reaches. It is the ceiling a memory-bound kernel is judged against in `kiln report` (the
// datasheet figure is never reached), so it is measured on the device itself, with the same
// events the tuner times candidates with.
#pragma once

#include <optional>

#include "jit/device.h"

namespace kiln::jit {

// GB/s moved (bytes read plus bytes written) by cuMemcpyDtoDAsync of a buffer well beyond L2:
// the median of several timed copies after a warm-up. nullopt when the scratch memory cannot
// be had (a nearly full GPU): the report then leaves "% of copy" blank rather than guessing.
std::optional<double> measure_copy_bandwidth_gbs(const DeviceInfo& device);

}  // namespace kiln::jit

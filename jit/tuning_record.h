// What the runtime writes to and reads from the tuning database beside the tuner's own
// TuneResult: the versions and the device a result was measured with, and whether a stored
// winner may still be used.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "jit/device.h"
#include "tuner/tuner.h"

namespace kiln::jit {

// "13.0" from the driver's 13000.
std::string driver_version_string(int version);

// The TuneResult's JSON plus "versions": {"kiln", "nvrtc", "driver"} and "device": {"name",
// "fingerprint", "sm", "sm_count", "memory_bytes", "l2_bytes", "bandwidth_gbs" (datasheet),
// "copy_bandwidth_gbs" (measured; only when it could be)}.
nlohmann::json tuning_document(const TuneResult& result, const DeviceInfo& device,
                               const std::string& nvrtc_version,
                               std::optional<double> copy_bandwidth_gbs = std::nullopt);

// The stored winner, when the document has a readable one that the family still accepts for
// the problem on the device (a family update may have narrowed its space); nullopt otherwise,
// with `why` saying what was wrong.
std::optional<Config> usable_winner(const nlohmann::json& document, const Family& family,
                                    const Problem& problem, const DeviceTraits& device,
                                    std::string& why);

}  // namespace kiln::jit

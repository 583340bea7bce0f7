#include "jit/tuning_record.h"

#include "templates/family.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::jit {

std::string driver_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

nlohmann::json tuning_document(const TuneResult& result, const DeviceInfo& device,
                               const std::string& nvrtc_version,
                               std::optional<double> copy_bandwidth_gbs) {
  nlohmann::json document = result;
  document["versions"] = {
      {"kiln", KILN_VERSION},
      {"nvrtc", nvrtc_version},
      {"driver", driver_version_string(device.driver_version)},
  };
  document["device"] = {
      {"name", device.name},
      {"fingerprint", device.fingerprint()},
      {"sm", device.sm()},
      {"sm_count", device.sm_count},
      {"memory_bytes", device.memory_bytes},
      {"l2_bytes", device.l2_bytes},
      {"bandwidth_gbs", device.datasheet_bandwidth_gbs()},
  };
  if (copy_bandwidth_gbs) document["device"]["copy_bandwidth_gbs"] = *copy_bandwidth_gbs;
  return document;
}

std::optional<Config> usable_winner(const nlohmann::json& document, const Family& family,
                                    const Problem& problem, const DeviceTraits& device,
                                    std::string& why) {
  Config winner;
  try {
    winner = document.at("winner").get<Config>();
  } catch (const std::exception& error) {
    why = std::string("no readable winner: ") + error.what();
    return std::nullopt;
  }
  why = family.invalid_reason(problem, winner, device);
  if (!why.empty()) {
    why = "stored winner " + winner.key() + " is no longer valid: " + why;
    return std::nullopt;
  }
  return winner;
}

}  // namespace kiln::jit

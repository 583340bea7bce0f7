// Pinning tuning results (`kiln tune pin|unpin`). A stored result normally belongs to the kiln
// and NVRTC versions that measured it: after an upgrade the runtime tunes the problem again,
// since the kernels it measured may have changed. A pinned result is used as it is, whatever
// the versions, and neither a new tune nor `kiln tune import` replaces it: the way to keep a
// fleet on configurations measured once, or on a candidate chosen by hand from the report.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::jit {

bool is_pinned(const nlohmann::json& document);

// Why an unpinned document was measured with other versions than these (so its winner is
// stale and worth tuning again); empty when it is current or pinned.
std::string stale_reason(const nlohmann::json& document, const std::string& kiln_version,
                         const std::string& nvrtc_version);

struct PinRequest {
  bool pin = true;      // false: unpin
  std::string device;   // empty: all; else the folder, fingerprint or part of the name
  std::string op;       // empty: all ops
  std::string problem;  // empty: all; else a problem key, exactly
  std::optional<std::int64_t> bucket;  // a row bucket, or every bucket
  std::string config;                  // pin only: make this measured candidate the winner
};

struct PinOutcome {
  std::vector<std::string> changed;    // "<device>/<problem>.r<bucket>" per document written
  std::vector<std::string> unchanged;  // already in the asked state
};

// Pins or unpins the tuning results at `root` the request selects. Throws kiln::Error when
// nothing matches, when `config` is given for more than one result or names no candidate
// that measured ok in it, or when a document cannot be stored.
PinOutcome set_pinned(const std::filesystem::path& root, const PinRequest& request);

}  // namespace kiln::jit

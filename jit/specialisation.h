// Turning user-facing words ("rms_norm", "bf16", "sm_90") into a compile request, shared by
// the `kiln` command and the Python API so both validate and word errors the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "jit/compiler.h"

namespace kiln::jit {

// "sm_90", "sm90", "90" or "9.0" -> 90. Throws ArgumentError otherwise.
int parse_arch(std::string_view text);

struct SpecialisationSpec {
  std::string_view op = "rms_norm";
  std::string_view dtype = "bf16";
  std::int64_t hidden = 0;
  bool weight = true;
  // Problem::flags as given; when absent, rms_norm's has-weight bit from `weight` (0 for others).
  std::optional<std::uint32_t> flags;
  std::int64_t aux = 0;  // Problem::aux (e.g. RoPE's rotary dim)
  std::uint32_t align = 16;
  int sm = 90;
  BinaryFormat format = BinaryFormat::cubin;
  std::optional<Config> config;  // the family's heuristic for the arch when absent
  // The row bucket that heuristic is for (Family::heuristic_for_rows); its row-blind one when
  // absent. Not with `config`.
  std::optional<std::int64_t> rows;
  // The target GPU's own traits (its SM count draws the heuristic's row lines); the arch's
  // typical ones (DeviceTraits::for_arch) when absent.
  std::optional<DeviceTraits> traits;
};

// Sets `spec`'s target from an arch name: "sm_90" (or "90", "sm90"), or "native", the first
// GPU's arch and its own traits (its SM count draws the heuristic's row lines).
void set_target_arch(SpecialisationSpec& spec, std::string_view arch);

// Validates every field (ArgumentError naming the field otherwise) and fills a request.
CompileRequest make_compile_request(const SpecialisationSpec& spec);

}  // namespace kiln::jit

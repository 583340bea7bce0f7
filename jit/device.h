// What kiln knows about one GPU: probed once through the driver API.
#pragma once

#include <cstdint>
#include <string>

#include "templates/types.h"

namespace kiln::jit {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t smem_per_block = 0;
  std::int64_t smem_per_block_optin = 0;
  std::int64_t smem_per_sm = 0;
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int regs_per_block = 0;
  int regs_per_sm = 0;
  std::int64_t memory_bytes = 0;
  int memory_bus_bits = 0;
  std::int64_t memory_clock_khz = 0;
  int driver_version = 0;  // e.g. 13000

  int sm() const { return cc_major * 10 + cc_minor; }
  // Datasheet peak: bus width x memory clock x 2 (double data rate), in GB/s.
  double datasheet_bandwidth_gbs() const;
  // The tuning key: name, compute capability, SM count, memory size. Identical GPUs share
  // it (and so their tuning results); a driver update does not change it.
  std::string fingerprint() const;
  DeviceTraits traits() const;
};

}  // namespace kiln::jit

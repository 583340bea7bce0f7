// Emptying the L2 between the timed runs of tuning candidates, so each starts cold as an op in a
// model does (its inputs evicted by the layers between). A memset of twice the L2 does not
// empty it: it leaves the lines a kernel read with L2::evict_last (the first pass of kiln's
// re-read rows) and some read plainly. Every candidate reads the same inputs, so after any
// re-read config had run, the others started with part of their input in L2. So an evict_last
// read of the buffer (which displaces earlier evict_last lines) comes before the memset (which
// leaves the L2 dirty, as a layer's writes leave it). The benches' flush writes another buffer
// than it reads; a second buffer here left the tuner's times as they were (H200, 2026-11-24),
// though torch.compile's kernels ran 8-10% slower after this flush than after the benches'.
#pragma once

#include <cstddef>
#include <string_view>

#include "jit/cuda_api.h"
#include "jit/device.h"
#include "jit/device_memory.h"
#include "templates/types.h"

namespace kiln::jit {

// The reading kernel's source: `kiln_l2_scrub`, taking one struct {data pointer, count of
// 16-byte vectors} by value and reading that many vectors with L2 evict_last priority (a plain
// read before sm_80, which has no L2 priorities).
std::string_view l2_scrub_source();

class L2Flush {
 public:
  // Compiles and loads the reading kernel on first use for the device (once per process) and
  // allocates `bytes` (rounded up to 16). Throws kiln::Error, with NVRTC's log, on failure.
  L2Flush(const DeviceInfo& device, std::size_t bytes);

  // Queues the read and the memset on `stream`.
  void run(CUstream stream);

 private:
  struct Params {
    CUdeviceptr data;
    unsigned long long vectors;
  };
  int ordinal_;
  CUfunction read_;
  DeviceBuffer buffer_;
  LaunchGeometry geometry_;
  Params params_;
};

}  // namespace kiln::jit

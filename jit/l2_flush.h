// Emptying the L2 between the timed runs of tuning candidates, so each starts cold as an op in a
// model does (its inputs evicted by the layers between). Every candidate runs on the same
// buffers, and lines a candidate read with L2::evict_last (the first pass of kiln's re-read
// rows) outlived every flush tried that only moves other data through L2: a memset of twice
// the L2, and an evict_last read of 2 to 10 times the L2 before the memset. On an H200
// (2026-11-24), timed in rounds beside re-read candidates, held rows ran 0.4-1.4 us faster
// than alone (1.5-2.3 us faster than as op calls), and re-read ones up to 1.2 us slower, so the
// tuner chose held rows that ran slower as calls. So the flush first lowers the candidates' own
// lines to evict_normal (`applypriority`), then reads its buffer with evict_last (which did
// displace a single earlier evict_last read of an input), then memsets it (leaving L2 dirty, as a
// layer's writes leave it). With the lowering the tuner's times of held and re-read rows came
// within 0.2 us of their calls'. The benches' flush writes another buffer than it reads; a second
// buffer here left the tuner's times as they were, though torch.compile's kernels ran 8-10% slower
// after this flush than after the benches'.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "jit/cuda_api.h"
#include "jit/device.h"
#include "jit/device_memory.h"
#include "templates/types.h"

namespace kiln::jit {

// The regions one launch of `kiln_l2_lower` takes: the length of its parameter struct's
// arrays, written into its source and into the host's copy of that struct.
inline constexpr std::size_t kL2LowerRegions = 8;

// The flush kernels' source: `kiln_l2_scrub`, taking one struct {data pointer, count of
// 16-byte vectors} by value and reading that many vectors with L2 evict_last priority, and
// `kiln_l2_lower`, taking up to kL2LowerRegions {address, count of 128-byte lines} and
// setting those lines' L2 priority to evict_normal. Before sm_80, which has no L2
// priorities, the read is plain and the lowering does nothing.
std::string l2_flush_source();

// Memory whose lines in L2 the flush lowers to evict_normal before it runs.
struct L2Region {
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
};

class L2Flush {
 public:
  // Compiles and loads the flush kernels on first use for the device (once per process) and
  // allocates `bytes` (rounded up to 16). `lowered`: the memory the measured kernels read and
  // write (the evaluator's timing and checking buffers), in any number of regions.
  // Throws kiln::Error, with NVRTC's log, on failure.
  L2Flush(const DeviceInfo& device, std::size_t bytes, const std::vector<L2Region>& lowered = {});

  // Queues the lowering, the read and the memset on `stream`.
  void run(CUstream stream);

 private:
  struct ReadParams {
    CUdeviceptr data;
    unsigned long long vectors;
  };
  struct LowerParams {  // kiln_l2_lower's KilnL2LowerParams
    CUdeviceptr address[kL2LowerRegions];
    unsigned long long lines[kL2LowerRegions];
    unsigned count;
  };
  static_assert(sizeof(LowerParams) == 16 * kL2LowerRegions + 8, "as KilnL2LowerParams");
  int ordinal_;
  CUfunction read_;
  CUfunction lower_;
  DeviceBuffer buffer_;
  LaunchGeometry read_geometry_;
  ReadParams read_params_;
  LaunchGeometry lower_geometry_;
  std::vector<LowerParams> lower_params_;  // empty before sm_80
};

}  // namespace kiln::jit

#include "jit/copy_bandwidth.h"

#include <algorithm>
#include <vector>

#include "cache/error.h"
#include "cache/log.h"
#include "jit/device_memory.h"
#include "jit/driver.h"
#include "jit/module.h"

namespace kiln::jit {
namespace {

constexpr int kWarmupCopies = 2;
constexpr int kTimedCopies = 15;

// Large enough that the copy runs at its steady state (over 30x any L2 today), small enough
// to take a few milliseconds and to fit beside a loaded model.
std::size_t copy_bytes(const DeviceInfo& device) {
  const auto l2 = static_cast<std::size_t>(std::max<std::int64_t>(device.l2_bytes, 0));
  const auto memory = static_cast<std::size_t>(std::max<std::int64_t>(device.memory_bytes, 0));
  return std::min(std::max<std::size_t>(std::size_t{256} << 20, 32 * l2), memory / 16);
}

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

std::optional<double> measure_copy_bandwidth_gbs(const DeviceInfo& device) {
  try {
    ScopedContext context(device.ordinal);
    const std::size_t bytes = copy_bytes(device);
    DeviceBuffer source(bytes), destination(bytes);
    Stream stream;
    Driver& d = driver();
    check(d.cuMemsetD8Async(source.address(), 0x5A, bytes, stream.get()), "cuMemsetD8Async",
          "filling the copy-bandwidth source");
    const auto copy = [&] {
      check(d.cuMemcpyDtoDAsync(destination.address(), source.address(), bytes, stream.get()),
            "cuMemcpyDtoDAsync", "measuring copy bandwidth");
    };
    for (int i = 0; i < kWarmupCopies; ++i) {
      copy();
    }
    std::vector<Event> starts(kTimedCopies), ends(kTimedCopies);
    for (int i = 0; i < kTimedCopies; ++i) {
      check(d.cuEventRecord(starts[i].get(), stream.get()), "cuEventRecord", "copy bandwidth");
      copy();
      check(d.cuEventRecord(ends[i].get(), stream.get()), "cuEventRecord", "copy bandwidth");
    }
    stream.synchronize("measuring copy bandwidth");
    std::vector<double> gbs;
    for (int i = 0; i < kTimedCopies; ++i) {
      float ms = 0;
      check(d.cuEventElapsedTime(&ms, starts[i].get(), ends[i].get()), "cuEventElapsedTime",
            "copy bandwidth");
      if (ms > 0) {
        gbs.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
      }
    }
    if (gbs.empty()) {
      return std::nullopt;
    }
    return median(std::move(gbs));
  } catch (const Error& error) {
    log::warn("kiln: could not measure the copy bandwidth of " + device.name + ": " +
              error.message());
    return std::nullopt;
  }
}

}  // namespace kiln::jit

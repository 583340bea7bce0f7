#include "jit/l2_flush.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/error.h"
#include "jit/compiler.h"
#include "jit/driver.h"
#include "jit/launch.h"
#include "jit/module.h"
#include "jit/nvrtc.h"
#include "jit/target.h"

namespace kiln::jit {
namespace {

constexpr std::string_view kSource = R"(
struct KilnL2ScrubParams {
  const char* data;
  unsigned long long vectors;
};

extern "C" __global__ void kiln_l2_scrub(KilnL2ScrubParams p) {
#if __CUDA_ARCH__ >= 800
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < p.vectors; i += stride) {
    const char* address = p.data + i * 16;
    unsigned a, b, c, d;
#if __CUDA_ARCH__ >= 800
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(address), "l"(policy));
#else
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(address));
#endif
    asm volatile("" ::"r"(a), "r"(b), "r"(c), "r"(d));  // the values are not wanted
  }
}

struct KilnL2LowerParams {
  const char* address[KILN_L2_LOWER_REGIONS];
  unsigned long long lines[KILN_L2_LOWER_REGIONS];
  unsigned count;
};

extern "C" __global__ void kiln_l2_lower(KilnL2LowerParams p) {
#if __CUDA_ARCH__ >= 800
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned r = 0; r < p.count; ++r) {
    for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < p.lines[r]; i += stride) {
      asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p.address[r] + i * 128)
                   : "memory");
    }
  }
#endif
}
)";

constexpr std::uint32_t kThreads = 256;
constexpr std::uint32_t kBlocksPerSm = 8;
constexpr std::size_t kLineBytes = 128;

struct FlushFunctions {
  CUfunction read = nullptr;
  CUfunction lower = nullptr;
};

CompiledKernel compile_flush(int sm) {
  const Nvrtc& api = nvrtc();
  const CompileTarget target =
      choose_target(sm, BinaryFormat::cubin, api.archs, api.version_string());
  const std::string source = l2_flush_source();
  NvrtcProgram program(source, "kiln_l2_flush.cu", {});
  Expected<NvrtcOutput> output = program.compile(compile_options(target.arch, target.format),
                                                 target.format == BinaryFormat::cubin);
  if (!output) {
    throw Error("kiln: compiling the L2 flush kernels for sm_" + std::to_string(sm) +
                    " failed: " + output.error().message(),
                output.error().log());
  }
  CompiledKernel kernel;
  kernel.key = "l2-flush";
  kernel.format = target.format;
  kernel.binary =
      target.format == BinaryFormat::cubin ? std::move(output->cubin) : std::move(output->ptx);
  return kernel;
}

// Loaded once per device and kept, as every kiln kernel is (modules are never unloaded).
// load_kernels checks the ordinal.
FlushFunctions flush_functions(const DeviceInfo& device) {
  static std::mutex mutex;
  static std::map<int, FlushFunctions> loaded;
  std::lock_guard lock(mutex);
  FlushFunctions& functions = loaded[device.ordinal];
  if (!functions.read) {
    CompiledKernel kernel = compile_flush(device.sm());
    kernel.name_expression = "the L2 flush";
    const std::string names[] = {"kiln_l2_scrub", "kiln_l2_lower"};
    const std::vector<LoadedKernel> kernels = load_kernels(device.ordinal, kernel, names, 0);
    functions.read = kernels[0].function;
    functions.lower = kernels[1].function;
  }
  return functions;
}

LaunchGeometry grid_stride_geometry(const DeviceInfo& device, unsigned long long items) {
  LaunchGeometry geometry;
  geometry.block[0] = kThreads;
  const auto wanted = static_cast<unsigned long long>(std::max(device.sm_count, 1)) * kBlocksPerSm;
  const unsigned long long needed = std::max((items + kThreads - 1) / kThreads, 1ULL);
  geometry.grid[0] = static_cast<std::uint32_t>(std::min(wanted, needed));
  return geometry;
}

}  // namespace

std::string l2_flush_source() {
  return "#define KILN_L2_LOWER_REGIONS " + std::to_string(kL2LowerRegions) + "\n" +
         std::string(kSource);
}

L2Flush::L2Flush(const DeviceInfo& device, std::size_t bytes, const std::vector<L2Region>& lowered)
    : ordinal_(device.ordinal),
      buffer_((std::max<std::size_t>(bytes, 16) + 15) / 16 * 16),
      read_params_{buffer_.address(), buffer_.bytes() / 16} {
  const FlushFunctions functions = flush_functions(device);
  read_ = functions.read;
  lower_ = functions.lower;
  read_geometry_ = grid_stride_geometry(device, read_params_.vectors);
  if (device.sm() < 80) {
    return;  // no L2 priorities to lower
  }
  unsigned long long most_lines = 0;
  for (const L2Region& region : lowered) {
    if (region.bytes == 0) {
      continue;
    }
    if (lower_params_.empty() || lower_params_.back().count == kL2LowerRegions) {
      lower_params_.push_back(LowerParams{});
    }
    LowerParams& params = lower_params_.back();
    // From the line holding the first byte to the one holding the last.
    const CUdeviceptr first = region.address / kLineBytes * kLineBytes;
    params.address[params.count] = first;
    params.lines[params.count] =
        (region.address + region.bytes - first + kLineBytes - 1) / kLineBytes;
    most_lines = std::max(most_lines, params.lines[params.count]);
    ++params.count;
  }
  lower_geometry_ = grid_stride_geometry(device, most_lines);
}

void L2Flush::run(CUstream stream) {
  for (LowerParams& params : lower_params_) {
    launch_kernel(ordinal_, lower_, lower_geometry_, &params, stream);
  }
  launch_kernel(ordinal_, read_, read_geometry_, &read_params_, stream);
  check(driver().cuMemsetD8Async(buffer_.address(), 0, buffer_.bytes(), stream), "cuMemsetD8Async",
        "flushing L2");
}

}  // namespace kiln::jit

#include "jit/l2_flush.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

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
)";

constexpr const char* kKernelName = "kiln_l2_scrub";
constexpr std::uint32_t kThreads = 256;
constexpr std::uint32_t kBlocksPerSm = 8;

CompiledKernel compile_scrub(int sm) {
  const Nvrtc& api = nvrtc();
  const CompileTarget target =
      choose_target(sm, BinaryFormat::cubin, api.archs, api.version_string());
  NvrtcProgram program(kSource, "kiln_l2_scrub.cu", {});
  Expected<NvrtcOutput> output = program.compile(compile_options(target.arch, target.format),
                                                 target.format == BinaryFormat::cubin);
  if (!output) {
    throw Error("kiln: compiling the L2 flush kernel for sm_" + std::to_string(sm) +
                    " failed: " + output.error().message(),
                output.error().log());
  }
  CompiledKernel kernel;
  kernel.key = "l2-scrub";
  kernel.name_expression = kKernelName;
  kernel.lowered_name = kKernelName;
  kernel.format = target.format;
  kernel.binary =
      target.format == BinaryFormat::cubin ? std::move(output->cubin) : std::move(output->ptx);
  return kernel;
}

// Loaded once per device and kept, as every kiln kernel is (modules are never unloaded).
// load_kernel checks the ordinal.
CUfunction scrub_function(const DeviceInfo& device) {
  static std::mutex mutex;
  static std::map<int, CUfunction> loaded;
  std::lock_guard lock(mutex);
  CUfunction& function = loaded[device.ordinal];
  if (!function) {
    function = load_kernel(device.ordinal, compile_scrub(device.sm()), 0).function;
  }
  return function;
}

}  // namespace

std::string_view l2_scrub_source() {
  return kSource;
}

L2Flush::L2Flush(const DeviceInfo& device, std::size_t bytes)
    : ordinal_(device.ordinal),
      read_(scrub_function(device)),
      buffer_((std::max<std::size_t>(bytes, 16) + 15) / 16 * 16),
      params_{buffer_.address(), buffer_.bytes() / 16} {
  geometry_.block[0] = kThreads;
  const auto wanted = static_cast<unsigned long long>(std::max(device.sm_count, 1)) * kBlocksPerSm;
  const unsigned long long needed = (params_.vectors + kThreads - 1) / kThreads;
  geometry_.grid[0] = static_cast<std::uint32_t>(std::min(wanted, needed));
}

void L2Flush::run(CUstream stream) {
  launch_kernel(ordinal_, read_, geometry_, &params_, stream);
  check(driver().cuMemsetD8Async(buffer_.address(), 0, buffer_.bytes(), stream), "cuMemsetD8Async",
        "flushing L2");
}

}  // namespace kiln::jit

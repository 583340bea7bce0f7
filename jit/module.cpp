#include "jit/module.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "cache/error.h"
#include "jit/driver.h"

namespace kiln::jit {
namespace {

constexpr int kMaxDevices = 64;
constexpr std::uint32_t kDefaultDynamicSmem = 48 * 1024;

std::array<std::atomic<CUcontext>, kMaxDevices> g_contexts{};
std::mutex g_contexts_mutex;

}  // namespace

CUcontext primary_context(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    throw Error("kiln: device ordinal " + std::to_string(ordinal) + " out of range [0, " +
                std::to_string(kMaxDevices) + ")");
  }
  if (CUcontext context = g_contexts[ordinal].load(std::memory_order_acquire)) return context;
  std::lock_guard lock(g_contexts_mutex);
  if (CUcontext context = g_contexts[ordinal].load(std::memory_order_relaxed)) return context;
  Driver& d = driver();
  const std::string where = "device " + std::to_string(ordinal);
  CUdevice device = 0;
  check(d.cuDeviceGet(&device, ordinal), "cuDeviceGet", where);
  CUcontext context = nullptr;
  // Retained for the process and never released: kernels loaded into it stay launchable.
  check(d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", where);
  g_contexts[ordinal].store(context, std::memory_order_release);
  return context;
}

ScopedContext::ScopedContext(int ordinal) {
  const CUcontext context = primary_context(ordinal);
  check(driver().cuCtxPushCurrent(context), "cuCtxPushCurrent",
        "device " + std::to_string(ordinal));
}

ScopedContext::~ScopedContext() {
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

RelaxedCaptureMode::RelaxedCaptureMode() {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (driver().cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
    previous_ = mode;
    exchanged_ = true;
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (exchanged_) driver().cuThreadExchangeStreamCaptureMode(&previous_);
}

LoadedKernel load_kernel(int ordinal, const CompiledKernel& kernel,
                         std::uint32_t dynamic_smem_bytes) {
  Driver& d = driver();
  const std::string where =
      kernel.name_expression + " (key " + kernel.key + ") on device " + std::to_string(ordinal);
  ScopedContext scope(ordinal);
  RelaxedCaptureMode relaxed;

  // PTX is loaded as a C string.
  std::vector<char> image(kernel.binary);
  if (kernel.format == BinaryFormat::ptx) image.push_back('\0');

  std::vector<char> error_log(16 * 1024, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size())};
  CUmodule module = nullptr;
  const CUresult loaded = d.cuModuleLoadDataEx(&module, image.data(), 2, options, values);
  if (loaded != CUDA_SUCCESS) {
    throw Error("CUDA driver: cuModuleLoadDataEx failed (" + where + "): " + describe(loaded),
                std::string(error_log.data()));
  }

  LoadedKernel out;
  check(d.cuModuleGetFunction(&out.function, module, kernel.lowered_name.c_str()),
        "cuModuleGetFunction", where + ", symbol " + kernel.lowered_name);
  // Reading attributes also forces a lazily loaded function in now, not at its first launch
  // (which may be inside a graph capture).
  const auto attribute = [&](CUfunction_attribute which, const char* what) {
    int value = 0;
    check(d.cuFuncGetAttribute(&value, which, out.function), "cuFuncGetAttribute",
          where + ", " + what);
    return value;
  };
  out.max_threads_per_block = attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "max threads");
  out.registers = attribute(CU_FUNC_ATTRIBUTE_NUM_REGS, "registers");
  out.static_smem_bytes = attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "static smem");
  out.local_bytes = attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "local memory");
  // The default limit covers static and dynamic shared memory together.
  if (dynamic_smem_bytes + static_cast<std::uint32_t>(out.static_smem_bytes) >
      kDefaultDynamicSmem) {
    check(d.cuFuncSetAttribute(out.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               static_cast<int>(dynamic_smem_bytes)),
          "cuFuncSetAttribute",
          where + ", dynamic shared memory " + std::to_string(dynamic_smem_bytes) + " bytes");
  }
  return out;
}

}  // namespace kiln::jit

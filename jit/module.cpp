#include "jit/module.h"

#include <array>
#include <atomic>
#include <mutex>
#include <span>
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

// `name` of a loaded module, its attributes read, opted in to `dynamic_smem_bytes`.
LoadedKernel function_of(CUmodule module, const std::string& name, const std::string& where,
                         std::uint32_t dynamic_smem_bytes) {
  Driver& d = driver();
  const std::string symbol = where + ", symbol " + name;
  LoadedKernel out;
  check(d.cuModuleGetFunction(&out.function, module, name.c_str()), "cuModuleGetFunction", symbol);
  // Reading attributes also forces a lazily loaded function in now, not at its first launch
  // (which may be inside a graph capture).
  const auto attribute = [&](CUfunction_attribute which, const char* what) {
    int value = 0;
    check(d.cuFuncGetAttribute(&value, which, out.function), "cuFuncGetAttribute",
          symbol + ", " + what);
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
          symbol + ", dynamic shared memory " + std::to_string(dynamic_smem_bytes) + " bytes");
  }
  return out;
}

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

std::vector<LoadedKernel> load_kernels(int ordinal, const CompiledKernel& kernel,
                                       std::span<const std::string> lowered_names,
                                       std::uint32_t dynamic_smem_bytes) {
  Driver& d = driver();
  const std::string where =
      kernel.name_expression + " (key " + kernel.key + ") on device " + std::to_string(ordinal);
  ScopedContext scope(ordinal);
  RelaxedCaptureMode relaxed;

  // PTX is loaded as a C string.
  std::vector<char> image(kernel.binary);
  if (kernel.format == BinaryFormat::ptx) {
    image.push_back('\0');
  }

  std::vector<char> error_log(std::size_t{16} * 1024, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size())};
  CUmodule module = nullptr;
  const CUresult loaded = d.cuModuleLoadDataEx(&module, image.data(), 2, options, values);
  if (loaded != CUDA_SUCCESS) {
    throw Error("CUDA driver: cuModuleLoadDataEx failed (" + where + "): " + describe(loaded),
                std::string(error_log.data()));
  }

  std::vector<LoadedKernel> functions;
  functions.reserve(lowered_names.size());
  for (const std::string& name : lowered_names) {
    functions.push_back(function_of(module, name, where, dynamic_smem_bytes));
  }
  return functions;
}

LoadedKernel load_kernel(int ordinal, const CompiledKernel& kernel,
                         std::uint32_t dynamic_smem_bytes) {
  return load_kernels(ordinal, kernel, std::span(&kernel.lowered_name, 1), dynamic_smem_bytes)
      .front();
}

}  // namespace kiln::jit

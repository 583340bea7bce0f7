#include "jit/driver.h"

#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>

#include "cache/error.h"

namespace kiln::jit {
namespace {

std::atomic<Driver*> g_driver{nullptr};
std::mutex g_driver_mutex;

// Entry points are resolved by their exported, versioned names (what cuda.h's #defines map
// the plain names to), newest first. Symbols are looked up with dlsym rather than
// cuGetProcAddress because every name below is exported by every driver kiln supports
// (CUDA 12.0 and newer), so the table is the same whichever driver is installed; only
// cuEventElapsedTime gained a _v2 (CUDA 12.8) that older drivers lack.
template <typename Fn>
void resolve(const SharedLibrary& library, Fn& slot, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* address = library.symbol(name)) {
      slot = reinterpret_cast<Fn>(address);
      return;
    }
  }
  std::string tried;
  for (const char* name : names) tried += (tried.empty() ? "" : ", ") + std::string(name);
  throw Error("kiln: the CUDA driver " + library.path().string() + " does not export " + tried +
              "; a driver for CUDA 12.0 or newer is required");
}

std::unique_ptr<Driver> open_driver() {
  const SharedLibrary library = load_library(driver_library_spec());
  auto d = std::make_unique<Driver>();
  d->path = library.path().string();
  resolve(library, d->cuInit, {"cuInit"});
  resolve(library, d->cuDriverGetVersion, {"cuDriverGetVersion"});
  resolve(library, d->cuGetErrorName, {"cuGetErrorName"});
  resolve(library, d->cuGetErrorString, {"cuGetErrorString"});
  resolve(library, d->cuDeviceGetCount, {"cuDeviceGetCount"});
  resolve(library, d->cuDeviceGet, {"cuDeviceGet"});
  resolve(library, d->cuDeviceGetName, {"cuDeviceGetName"});
  resolve(library, d->cuDeviceGetAttribute, {"cuDeviceGetAttribute"});
  resolve(library, d->cuDeviceTotalMem, {"cuDeviceTotalMem_v2"});
  resolve(library, d->cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"});
  resolve(library, d->cuCtxGetCurrent, {"cuCtxGetCurrent"});
  resolve(library, d->cuCtxSetCurrent, {"cuCtxSetCurrent"});
  resolve(library, d->cuCtxPushCurrent, {"cuCtxPushCurrent_v2"});
  resolve(library, d->cuCtxPopCurrent, {"cuCtxPopCurrent_v2"});
  resolve(library, d->cuModuleLoadDataEx, {"cuModuleLoadDataEx"});
  resolve(library, d->cuModuleGetFunction, {"cuModuleGetFunction"});
  resolve(library, d->cuFuncGetAttribute, {"cuFuncGetAttribute"});
  resolve(library, d->cuFuncSetAttribute, {"cuFuncSetAttribute"});
  // The plain (legacy default stream) variants: kiln always passes the caller's stream, and
  // torch's default stream is the legacy one.
  resolve(library, d->cuLaunchKernel, {"cuLaunchKernel"});
  resolve(library, d->cuLaunchKernelEx, {"cuLaunchKernelEx"});
  resolve(library, d->cuMemAlloc, {"cuMemAlloc_v2"});
  resolve(library, d->cuMemFree, {"cuMemFree_v2"});
  resolve(library, d->cuMemcpyHtoD, {"cuMemcpyHtoD_v2"});
  resolve(library, d->cuMemcpyDtoH, {"cuMemcpyDtoH_v2"});
  resolve(library, d->cuMemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"});
  resolve(library, d->cuMemsetD8, {"cuMemsetD8_v2"});
  resolve(library, d->cuMemsetD8Async, {"cuMemsetD8Async"});
  resolve(library, d->cuStreamCreate, {"cuStreamCreate"});
  resolve(library, d->cuStreamDestroy, {"cuStreamDestroy_v2"});
  resolve(library, d->cuStreamSynchronize, {"cuStreamSynchronize"});
  resolve(library, d->cuStreamIsCapturing, {"cuStreamIsCapturing"});
  resolve(library, d->cuThreadExchangeStreamCaptureMode, {"cuThreadExchangeStreamCaptureMode"});
  resolve(library, d->cuEventCreate, {"cuEventCreate"});
  resolve(library, d->cuEventDestroy, {"cuEventDestroy_v2"});
  resolve(library, d->cuEventRecord, {"cuEventRecord"});
  resolve(library, d->cuEventSynchronize, {"cuEventSynchronize"});
  resolve(library, d->cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"});

  const CUresult init = d->cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    const char* text = nullptr;
    d->cuGetErrorName(init, &name);
    d->cuGetErrorString(init, &text);
    const std::string why = std::string(name ? name : "CUresult " + std::to_string(init)) +
                            (text ? std::string(": ") + text : std::string());
    if (init == CUDA_ERROR_NO_DEVICE) {
      throw Error("kiln: no CUDA device: the driver " + d->path + " reports none (cuInit: " + why +
                  ")");
    }
    throw Error("kiln: the CUDA driver " + d->path + " failed to initialise (cuInit: " + why + ")");
  }
  check(d->cuDriverGetVersion(&d->version), "cuDriverGetVersion", "driver version");
  return d;
}

}  // namespace

Driver& driver() {
  if (Driver* loaded = g_driver.load(std::memory_order_acquire)) return *loaded;
  std::lock_guard lock(g_driver_mutex);
  if (Driver* loaded = g_driver.load(std::memory_order_relaxed)) return *loaded;
  // Kept for the life of the process, like the library itself.
  Driver* opened = open_driver().release();
  g_driver.store(opened, std::memory_order_release);
  return *opened;
}

std::string describe(CUresult result) {
  const Driver* d = g_driver.load(std::memory_order_acquire);
  const char* name = nullptr;
  const char* text = nullptr;
  if (d) {
    d->cuGetErrorName(result, &name);
    d->cuGetErrorString(result, &text);
  }
  std::string out = name ? std::string(name) : "CUresult " + std::to_string(result);
  if (text) out += std::string(": ") + text;
  return out;
}

void check(CUresult result, std::string_view call, std::string_view context) {
  if (result == CUDA_SUCCESS) return;
  throw Error("CUDA driver: " + std::string(call) + " failed (" + std::string(context) +
              "): " + describe(result));
}

}  // namespace kiln::jit

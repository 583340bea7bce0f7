// The CUDA driver API, loaded at run time: a table of typed entry points resolved once.
#pragma once

#include <string>
#include <string_view>

#include "jit/cuda_api.h"
#include "jit/shared_library.h"

namespace kiln::jit {

struct Driver {
  std::string path;  // the libcuda that was opened
  int version = 0;   // cuDriverGetVersion, e.g. 13000

  PFN_cuInit cuInit = nullptr;
  PFN_cuDriverGetVersion cuDriverGetVersion = nullptr;
  PFN_cuGetErrorName cuGetErrorName = nullptr;
  PFN_cuGetErrorString cuGetErrorString = nullptr;

  PFN_cuDeviceGetCount cuDeviceGetCount = nullptr;
  PFN_cuDeviceGet cuDeviceGet = nullptr;
  PFN_cuDeviceGetName cuDeviceGetName = nullptr;
  PFN_cuDeviceGetAttribute cuDeviceGetAttribute = nullptr;
  PFN_cuDeviceTotalMem cuDeviceTotalMem = nullptr;

  PFN_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain = nullptr;
  PFN_cuCtxGetCurrent cuCtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent cuCtxSetCurrent = nullptr;
  PFN_cuCtxPushCurrent cuCtxPushCurrent = nullptr;
  PFN_cuCtxPopCurrent cuCtxPopCurrent = nullptr;

  PFN_cuModuleLoadDataEx cuModuleLoadDataEx = nullptr;
  PFN_cuModuleGetFunction cuModuleGetFunction = nullptr;
  PFN_cuFuncGetAttribute cuFuncGetAttribute = nullptr;
  PFN_cuFuncSetAttribute cuFuncSetAttribute = nullptr;
  PFN_cuLaunchKernel cuLaunchKernel = nullptr;
  PFN_cuLaunchKernelEx cuLaunchKernelEx = nullptr;  // CUDA 12.0 and newer

  PFN_cuMemAlloc cuMemAlloc = nullptr;
  PFN_cuMemFree cuMemFree = nullptr;
  PFN_cuMemcpyHtoD cuMemcpyHtoD = nullptr;
  PFN_cuMemcpyDtoH cuMemcpyDtoH = nullptr;
  PFN_cuMemcpyDtoDAsync cuMemcpyDtoDAsync = nullptr;
  PFN_cuMemsetD8 cuMemsetD8 = nullptr;
  PFN_cuMemsetD8Async cuMemsetD8Async = nullptr;

  PFN_cuStreamCreate cuStreamCreate = nullptr;
  PFN_cuStreamDestroy cuStreamDestroy = nullptr;
  PFN_cuStreamSynchronize cuStreamSynchronize = nullptr;
  PFN_cuStreamIsCapturing cuStreamIsCapturing = nullptr;
  PFN_cuThreadExchangeStreamCaptureMode cuThreadExchangeStreamCaptureMode = nullptr;

  PFN_cuEventCreate cuEventCreate = nullptr;
  PFN_cuEventDestroy cuEventDestroy = nullptr;
  PFN_cuEventRecord cuEventRecord = nullptr;
  PFN_cuEventSynchronize cuEventSynchronize = nullptr;
  PFN_cuEventElapsedTime cuEventElapsedTime = nullptr;
};

// The process's driver table: opened and cuInit(0)-ed on first use (thread-safe). Throws
// kiln::Error "kiln: no CUDA driver found: tried ..." when libcuda cannot be opened, and
// "kiln: no CUDA device ..." when the driver reports none. A failed attempt is retried on the
// next call (a library folder may have been added since); a success is kept for the process.
Driver& driver();

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory" (or the number when the driver cannot name it).
std::string describe(CUresult result);

// Throws kiln::Error "CUDA driver: <call> failed (<context>): CUDA_ERROR_...: <text>" unless
// `result` is CUDA_SUCCESS.
void check(CUresult result, std::string_view call, std::string_view context);

}  // namespace kiln::jit

#include "jit/launch.h"

#include <string>

#include "jit/driver.h"
#include "jit/module.h"

namespace kiln::jit {

namespace {

void make_current(Driver& d, int ordinal) {
  const CUcontext wanted = primary_context(ordinal);
  CUcontext current = nullptr;
  check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent", "launch");
  if (current != wanted) {
    check(d.cuCtxSetCurrent(wanted), "cuCtxSetCurrent", "device " + std::to_string(ordinal));
  }
}

}  // namespace

void launch_kernel(int ordinal, CUfunction function, const LaunchGeometry& geometry,
                   const void* params, CUstream stream) {
  if (geometry.grid[0] == 0 || geometry.grid[1] == 0 || geometry.grid[2] == 0) return;
  Driver& d = driver();
  make_current(d, ordinal);
  void* args[] = {const_cast<void*>(params)};
  const CUresult result = d.cuLaunchKernel(
      function, geometry.grid[0], geometry.grid[1], geometry.grid[2], geometry.block[0],
      geometry.block[1], geometry.block[2], geometry.smem_bytes, stream, args, nullptr);
  if (result != CUDA_SUCCESS) {
    check(result, "cuLaunchKernel",
          "grid " + std::to_string(geometry.grid[0]) + "x" + std::to_string(geometry.grid[1]) +
              "x" + std::to_string(geometry.grid[2]) + ", block " +
              std::to_string(geometry.block[0]) + "x" + std::to_string(geometry.block[1]) + "x" +
              std::to_string(geometry.block[2]) + ", smem " + std::to_string(geometry.smem_bytes) +
              " on device " + std::to_string(ordinal));
  }
}

bool stream_is_capturing(int ordinal, CUstream stream) {
  Driver& d = driver();
  make_current(d, ordinal);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult result = d.cuStreamIsCapturing(stream, &status);
  if (result == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  check(result, "cuStreamIsCapturing", "device " + std::to_string(ordinal));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace kiln::jit

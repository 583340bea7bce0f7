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

CUresult launch_programmatic(Driver& d, CUfunction function, const LaunchGeometry& geometry,
                             void** args, CUstream stream) {
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmatic_stream_serialization_allowed = 1;
  CUlaunchConfig config{};
  config.grid_x = geometry.grid[0];
  config.grid_y = geometry.grid[1];
  config.grid_z = geometry.grid[2];
  config.block_x = geometry.block[0];
  config.block_y = geometry.block[1];
  config.block_z = geometry.block[2];
  config.shared_bytes = geometry.smem_bytes;
  config.stream = stream;
  config.attributes = &attribute;
  config.attribute_count = 1;
  return d.cuLaunchKernelEx(&config, function, args, nullptr);
}

}  // namespace

void launch_kernel(int ordinal, CUfunction function, const LaunchGeometry& geometry,
                   const void* params, CUstream stream, StreamOrder order) {
  if (geometry.grid[0] == 0 || geometry.grid[1] == 0 || geometry.grid[2] == 0) return;
  Driver& d = driver();
  make_current(d, ordinal);
  void* args[] = {const_cast<void*>(params)};
  const bool programmatic = order == StreamOrder::programmatic;
  const CUresult result =
      programmatic
          ? launch_programmatic(d, function, geometry, args, stream)
          : d.cuLaunchKernel(function, geometry.grid[0], geometry.grid[1], geometry.grid[2],
                             geometry.block[0], geometry.block[1], geometry.block[2],
                             geometry.smem_bytes, stream, args, nullptr);
  if (result != CUDA_SUCCESS) {
    check(result, programmatic ? "cuLaunchKernelEx" : "cuLaunchKernel",
          "grid " + std::to_string(geometry.grid[0]) + "x" + std::to_string(geometry.grid[1]) +
              "x" + std::to_string(geometry.grid[2]) + ", block " +
              std::to_string(geometry.block[0]) + "x" + std::to_string(geometry.block[1]) + "x" +
              std::to_string(geometry.block[2]) + ", smem " + std::to_string(geometry.smem_bytes) +
              " on device " + std::to_string(ordinal));
  }
}

bool supports_programmatic_launch(const DeviceInfo& device) {
  // The wait is an sm_90 instruction; drivers before 12.3 cannot capture such a launch into
  // a CUDA graph as the overlap it asks for.
  return device.cc_major >= 9 && device.driver_version >= 12030;
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

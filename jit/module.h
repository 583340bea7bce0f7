// Putting compiled kernels on a GPU: the device's primary context (the one torch and the CUDA
// runtime use), module loading, function lookup. Modules are never unloaded: a kernel handed
// out may be launched at any later time, from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "jit/compiler.h"
#include "jit/cuda_api.h"

namespace kiln::jit {

// The primary context of device `ordinal`, retained once for the process.
CUcontext primary_context(int ordinal);

// Makes a device's primary context current for a scope (push), restoring the previous one
// (pop) on exit. For work kiln does on its own (loading, evaluating), not for launches.
class ScopedContext {
 public:
  explicit ScopedContext(int ordinal);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
};

// Lets this thread make calls that are unsafe during stream capture (module loading) while
// some stream is being captured, restoring the thread's capture mode on exit.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

struct LoadedKernel {
  CUfunction function = nullptr;
  int max_threads_per_block = 0;  // what the compiled kernel allows (registers, launch bounds)
  int registers = 0;
  int static_smem_bytes = 0;
  int local_bytes = 0;  // spills
};

// Loads `kernel` (cubin, or PTX the driver JIT-compiles) into device `ordinal`'s primary
// context and looks its function up by lowered name. When `dynamic_smem_bytes` exceeds the
// default 48 KiB, opts the function in to that much. Throws kiln::Error naming the kernel.
LoadedKernel load_kernel(int ordinal, const CompiledKernel& kernel,
                         std::uint32_t dynamic_smem_bytes);

// The same for several functions of one binary: loads it once (one module) and looks up each
// of `lowered_names`, in order.
std::vector<LoadedKernel> load_kernels(int ordinal, const CompiledKernel& kernel,
                                       std::span<const std::string> lowered_names,
                                       std::uint32_t dynamic_smem_bytes);

}  // namespace kiln::jit

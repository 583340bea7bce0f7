// torch's current CUDA stream for a device, as a driver-API handle, reached through c10's
// device-generic interface so the extension needs neither CUDA headers nor libc10_cuda.
#pragma once

#include <c10/core/Device.h>

#include "jit/cuda_api.h"

namespace kiln::torch_ops {

jit::CUstream current_stream(const c10::Device& device);

}  // namespace kiln::torch_ops

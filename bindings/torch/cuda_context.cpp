#include "bindings/torch/cuda_context.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace kiln::torch_ops {

jit::CUstream current_stream(const c10::Device& device) {
  const c10::impl::DeviceGuardImplInterface* cuda =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return static_cast<jit::CUstream>(cuda->getStream(device).native_handle());
}

}  // namespace kiln::torch_ops

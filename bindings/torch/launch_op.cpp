#include "bindings/torch/launch_op.h"

#include <c10/util/Exception.h>

#include "bindings/torch/cuda_context.h"
#include "cache/error.h"
#include "jit/runtime.h"

namespace kiln::torch_ops {

void launch_op(const at::Tensor& like, const Problem& problem, std::int64_t rows,
               const void* params) {
  const jit::CUstream stream = current_stream(like.device());
  jit::Runtime& runtime = jit::Runtime::get();
  const jit::Kernel* kernel = nullptr;
  try {
    kernel = &runtime.kernel(like.get_device(), problem, rows, stream);
  } catch (const ArgumentError& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
  runtime.launch(*kernel, rows, params, stream);
}

}  // namespace kiln::torch_ops

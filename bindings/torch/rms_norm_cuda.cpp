// The CUDA implementation: validate, describe the problem, and hand it to the runtime, which
// returns a ready kernel from its table (compiling and tuning only on the first call of a
// specialisation).
#include <ATen/ATen.h>

#include "bindings/torch/norm_launch.h"
#include "bindings/torch/rms_norm.h"
#include "bindings/torch/tensor_checks.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/rms_norm_family.h"

namespace kiln::torch_ops {

at::Tensor rms_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  rms_norm_cuda_into(x, weight, eps, out);
  return out;
}

void rms_norm_cuda_into(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                        const at::Tensor& out) {
  const DType dtype = check_rms_norm(x, weight);
  if (!x.is_cuda()) {
    const std::string weight_device = weight ? weight->device().str() : "none";
    fail_value("rms_norm", "x", "a CUDA tensor (weight is on " + weight_device + ")",
               x.device().str());
  }
  const RowView view = row_view("rms_norm", x);
  if (view.rows == 0) {
    return;
  }

  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();
  const auto element = static_cast<std::uintptr_t>(dtype_size(dtype));
  Problem problem;
  problem.op = Op::rms_norm;
  problem.dtype = dtype;
  problem.hidden = view.hidden;
  problem.flags = weight ? kRmsNormHasWeight : 0u;
  problem.align = common_alignment(
      {reinterpret_cast<std::uintptr_t>(view.tensor.data_ptr()),
       reinterpret_cast<std::uintptr_t>(out.data_ptr()),
       w.defined() ? reinterpret_cast<std::uintptr_t>(w.data_ptr()) : std::uintptr_t{16},
       static_cast<std::uintptr_t>(view.row_stride) * element,
       static_cast<std::uintptr_t>(view.hidden) * element});

  NormParams params{};
  params.out = out.data_ptr();
  params.x = view.tensor.data_ptr();
  params.weight = w.defined() ? w.data_ptr() : nullptr;
  params.rows = view.rows;
  params.x_row_stride = view.row_stride;
  params.out_row_stride = view.hidden;
  params.eps = static_cast<float>(eps);
  launch_norm(x, problem, params);
}

}  // namespace kiln::torch_ops

// The CPU implementation is kiln's reference: plain ATen math in fp32 (fp64 for fp64 input).
#include <ATen/ATen.h>

#include "bindings/torch/rms_norm.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {

DType check_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  const DType dtype = kiln_dtype_or_cpu_double("rms_norm", "x", x);
  if (x.dim() == 0) fail_value("rms_norm", "x", "at least 1 dimension", "a 0-dimensional tensor");
  if (x.size(-1) <= 0) {
    fail_value("rms_norm", "x", "a last dimension (hidden size) > 0", shape_text(x));
  }
  if (weight) check_parameter("rms_norm", "weight", *weight, x);
  return dtype;
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  check_rms_norm(x, weight);
  if (!x.device().is_cpu()) fail_value("rms_norm", "x", "a CPU or CUDA tensor", x.device().str());
  const at::ScalarType math = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(math);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (weight) y = y * weight->to(math);
  return y.to(x.scalar_type()).contiguous();
}

}  // namespace kiln::torch_ops

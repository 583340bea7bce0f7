// Argument checks of the norm backward ops, shared by the CPU and CUDA implementations so
// both reject the same inputs with the same words.
#include <ATen/ATen.h>

#include "bindings/torch/norm.h"
#include "bindings/torch/norm_backward.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
void check_same_as(const std::string& op, const std::string& arg, const at::Tensor& tensor,
                   const std::string& like_name, const at::Tensor& like) {
  if (tensor.device() != like.device()) {
    fail_value(op, arg, "device " + like.device().str() + " (as " + like_name + ")",
               tensor.device().str());
  }
  if (tensor.scalar_type() != like.scalar_type()) {
    fail_type(op, arg, "dtype " + dtype_text(like.scalar_type()) + " (as " + like_name + ")",
              dtype_text(tensor.scalar_type()));
  }
  if (!tensor.sizes().equals(like.sizes())) {
    fail_value(op, arg, "shape " + shape_text(like) + " (as " + like_name + ")",
               shape_text(tensor));
  }
}

DType check_norm_backward(const std::string& op, const at::Tensor& dy, const at::Tensor& x,
                          const std::string& x_name, const std::optional<at::Tensor>& weight) {
  const DType dtype = kiln_dtype_or_cpu_double(op, x_name, x);
  if (x.dim() == 0) {
    fail_value(op, x_name, "at least 1 dimension", "a 0-dimensional tensor");
  }
  if (x.size(-1) <= 0) {
    fail_value(op, x_name, "a last dimension (hidden size) > 0", shape_text(x));
  }
  check_same_as(op, "dy", dy, x_name, x);
  if (weight) {
    check_parameter(op, "weight", *weight, x);
  }
  return dtype;
}

DType check_adaln_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                           const std::optional<at::Tensor>& weight, const std::string& norm,
                           const std::optional<at::Tensor>& table_scale) {
  const std::string op = "adaln_backward";
  const DType dtype = kiln_dtype_or_cpu_double(op, "x", x);
  if (x.dim() != 3 || x.size(2) <= 0) {
    fail_value(op, "x", "shape [B, T, D] with D > 0", shape_text(x));
  }
  parse_norm_kind(op, norm);
  check_same_as(op, "dy", dy, "x", x);
  if (scale.device() != x.device()) {
    fail_value(op, "scale", "device " + x.device().str() + " (as x)", scale.device().str());
  }
  if (scale.scalar_type() != x.scalar_type()) {
    fail_type(op, "scale", "dtype " + dtype_text(x.scalar_type()) + " (as x)",
              dtype_text(scale.scalar_type()));
  }
  const bool fits = scale.dim() == 3 && scale.size(0) == x.size(0) &&
                    (scale.size(1) == 1 || scale.size(1) == x.size(1)) &&
                    scale.size(2) == x.size(2);
  if (!fits) {
    const std::string b = std::to_string(x.size(0));
    const std::string d = std::to_string(x.size(2));
    fail_value(op, "scale",
               "shape [" + b + ", 1, " + d + "] (per sample) or [" + b + ", " +
                   std::to_string(x.size(1)) + ", " + d + "] (per token) for x of shape " +
                   shape_text(x),
               shape_text(scale));
  }
  if (weight) {
    check_parameter(op, "weight", *weight, x);
  }
  if (table_scale) {
    check_parameter(op, "table_scale", *table_scale, x);
  }
  return dtype;
}

}  // namespace kiln::torch_ops

// Argument checks shared by the CPU and CUDA implementations of the activation backward ops:
// the forward's checks of the inputs, then grad_out against the forward output they imply.
#include <string>

#include "bindings/torch/activation.h"
#include "bindings/torch/activation_backward.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

std::string sizes_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(sizes[d]);
  }
  return text + "]";
}

void check_grad_out(const char* op, const at::Tensor& grad_out, const char* ref_arg,
                    const at::Tensor& ref, at::IntArrayRef output_sizes) {
  check_same_kind(op, "grad_out", grad_out, ref_arg, ref);
  if (grad_out.sizes() != output_sizes) {
    fail_value(op, "grad_out", "shape " + sizes_text(output_sizes) + " (the forward output's)",
               shape_text(grad_out));
  }
}

}  // namespace

DType check_gated_backward(const char* op, const at::Tensor& grad_out, const at::Tensor& gate,
                           const std::optional<at::Tensor>& up) {
  const DType dtype = check_gated(op, gate, up);
  c10::SmallVector<std::int64_t, 6> sizes(gate.sizes().begin(), gate.sizes().end());
  if (!up) {
    sizes.back() /= 2;
  }
  check_grad_out(op, grad_out, "gate", gate, sizes);
  return dtype;
}

DType check_clamped_swiglu_backward(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                    double alpha, double limit) {
  const char* op = "clamped_swiglu_backward";
  const DType dtype = check_clamped_swiglu(op, gate_up, alpha, limit);
  c10::SmallVector<std::int64_t, 6> sizes(gate_up.sizes().begin(), gate_up.sizes().end());
  sizes.back() /= 2;
  check_grad_out(op, grad_out, "gate_up", gate_up, sizes);
  return dtype;
}

DType check_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x,
                          const std::optional<at::Tensor>& bias) {
  const char* op = "gelu_backward";
  const DType dtype = kernel_or_reference_dtype(op, "x", x);
  check_rows(op, "x", x);
  if (bias) {
    check_parameter(op, "bias", *bias, x);
  }
  check_grad_out(op, grad_out, "x", x, x.sizes());
  return dtype;
}

}  // namespace kiln::torch_ops

// The CPU references of the activation backward ops: the derivatives written out in ATen
// math, fp32 (float64 for float64 inputs), each gradient rounded once to the inputs' dtype.
#include <ATen/ATen.h>

#include "bindings/torch/activation.h"
#include "bindings/torch/activation_backward.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void require_cpu(const char* op, const char* arg, const at::Tensor& x) {
  if (!x.device().is_cpu()) fail_value(op, arg, "a CPU or CUDA tensor", x.device().str());
}

// (dgate, dup) as the inputs were given: two tensors, or one in gate's packed layout.
std::vector<at::Tensor> gated_grads(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                                    bool up_first, const at::Tensor& dgate, const at::Tensor& dup) {
  const at::ScalarType dtype = gate.scalar_type();
  if (up) return {dgate.to(dtype).contiguous(), dup.to(dtype).contiguous()};
  const at::Tensor packed = up_first ? at::cat({dup, dgate}, -1) : at::cat({dgate, dup}, -1);
  return {packed.to(dtype).contiguous()};
}

}  // namespace

std::vector<at::Tensor> swiglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate,
                                            const std::optional<at::Tensor>& up, bool up_first) {
  check_gated_backward("swiglu_backward", grad_out, gate, up);
  require_cpu("swiglu_backward", "gate", gate);
  const auto [g, u] = gated_halves(gate, up, up_first);
  const at::Tensor dy = grad_out.to(g.scalar_type());
  const at::Tensor s = at::sigmoid(g);
  // silu'(g) = s * (1 + g * (1 - s))
  const at::Tensor dgate = dy * u * s * (1 + g * (1 - s));
  return gated_grads(gate, up, up_first, dgate, dy * g * s);
}

std::vector<at::Tensor> geglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate,
                                           const std::optional<at::Tensor>& up,
                                           c10::string_view approximate, bool up_first) {
  check_gated_backward("geglu_backward", grad_out, gate, up);
  const bool erf = gelu_is_erf("geglu_backward", approximate);
  require_cpu("geglu_backward", "gate", gate);
  const auto [g, u] = gated_halves(gate, up, up_first);
  const at::Tensor dy = grad_out.to(g.scalar_type());
  const char* form = erf ? "none" : "tanh";
  return gated_grads(gate, up, up_first, at::gelu_backward(dy * u, g, form),
                     dy * at::gelu(g, form));
}

std::vector<at::Tensor> gelu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& bias,
                                          c10::string_view approximate) {
  check_gelu_backward(grad_out, x, bias);
  const bool erf = gelu_is_erf("gelu_backward", approximate);
  require_cpu("gelu_backward", "x", x);
  at::Tensor z = x.to(reference_math_type(x));
  if (bias) z = z + bias->to(z.scalar_type());
  const at::Tensor dx = at::gelu_backward(grad_out.to(z.scalar_type()), z, erf ? "none" : "tanh");
  std::vector<at::Tensor> grads{dx.to(x.scalar_type()).contiguous()};
  if (bias) {
    // Summed before rounding, as the CUDA kernel's fp32 partial sums are.
    grads.push_back(dx.reshape({-1, x.size(-1)}).sum(0).to(x.scalar_type()));
  }
  return grads;
}

}  // namespace kiln::torch_ops

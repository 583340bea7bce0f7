// The CPU implementations are kiln's reference for the activation ops: plain ATen math in
// fp32, rounded once to the inputs' dtype.
#include <ATen/ATen.h>

#include "bindings/torch/activation.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void require_cpu(const char* op, const char* arg, const at::Tensor& x) {
  if (!x.device().is_cpu()) fail_value(op, arg, "a CPU or CUDA tensor", x.device().str());
}

}  // namespace

std::pair<at::Tensor, at::Tensor> gated_halves(const at::Tensor& gate,
                                               const std::optional<at::Tensor>& up, bool up_first) {
  const at::ScalarType math = reference_math_type(gate);
  if (up) return {gate.to(math), up->to(math)};
  const std::int64_t half = gate.size(-1) / 2;
  at::Tensor first = gate.narrow(-1, 0, half).to(math);
  at::Tensor second = gate.narrow(-1, half, half).to(math);
  if (up_first) std::swap(first, second);
  return {first, second};
}

at::Tensor swiglu_cpu(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first) {
  check_gated("swiglu", gate, up);
  require_cpu("swiglu", "gate", gate);
  const auto [g, u] = gated_halves(gate, up, up_first);
  return (at::silu(g) * u).to(gate.scalar_type()).contiguous();
}

at::Tensor geglu_cpu(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                     c10::string_view approximate, bool up_first) {
  check_gated("geglu", gate, up);
  const bool erf = gelu_is_erf("geglu", approximate);
  require_cpu("geglu", "gate", gate);
  const auto [g, u] = gated_halves(gate, up, up_first);
  return (at::gelu(g, erf ? "none" : "tanh") * u).to(gate.scalar_type()).contiguous();
}

at::Tensor gelu_cpu(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                    c10::string_view approximate) {
  check_gelu(x, bias);
  const bool erf = gelu_is_erf("gelu", approximate);
  require_cpu("gelu", "x", x);
  at::Tensor xf = x.to(reference_math_type(x));
  if (bias) xf = xf + bias->to(xf.scalar_type());
  return at::gelu(xf, erf ? "none" : "tanh").to(x.scalar_type()).contiguous();
}

at::Tensor gated_residual_cpu(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate) {
  check_gated_residual("gated_residual", h, y, gate);
  require_cpu("gated_residual", "h", h);
  const at::Tensor result = at::addcmul(h.to(at::kFloat), y.to(at::kFloat), gate.to(at::kFloat));
  return result.to(h.scalar_type()).contiguous();
}

void gated_residual_inplace_cpu(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate) {
  check_gated_residual("gated_residual_", h, y, gate);
  require_cpu("gated_residual_", "h", h);
  check_writable("gated_residual_", h, y, gate);
  const at::Tensor result = at::addcmul(h.to(at::kFloat), y.to(at::kFloat), gate.to(at::kFloat));
  h.copy_(result);
}

}  // namespace kiln::torch_ops

// The CPU implementations of the norm ops are kiln's references: plain ATen math in fp32,
// rounding where the CUDA kernels round (the residual stream once, the output once). A
// float64 input (CPU only) is computed in float64, for torch.autograd.gradcheck.
#include <ATen/ATen.h>

#include "bindings/torch/norm.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void require_cpu(const std::string& op, const at::Tensor& x) {
  if (!x.device().is_cpu()) {
    fail_value(op, "x", "a CPU or CUDA tensor", x.device().str());
  }
}

at::Tensor rms(const at::Tensor& s, double eps) {
  return s * at::rsqrt(s.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

at::Tensor centred(const at::Tensor& s, double eps) {
  const at::Tensor mean = s.mean(-1, /*keepdim=*/true);
  const at::Tensor deviation = s - mean;
  return deviation * at::rsqrt(deviation.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

// The type the references compute in: float64 for float64 input, else float32.
at::ScalarType math_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor as_math(const std::optional<at::Tensor>& t, at::ScalarType math) {
  return t ? t->to(math) : at::Tensor();
}

// norm(s) [* weight] * (1 + scale) + shift, in s's type (already the math type).
at::Tensor modulate(const at::Tensor& s, const AdaLnArgs& args, double eps) {
  const at::ScalarType math = s.scalar_type();
  at::Tensor n = parse_norm_kind(args.op, args.norm) ? centred(s, eps) : rms(s, eps);
  if (args.weight->has_value()) {
    n = n * (*args.weight)->to(math);
  }
  at::Tensor scale = args.scale->to(math);
  at::Tensor shift = args.shift->to(math);
  if (has_tables(args)) {
    scale = scale + as_math(*args.table_scale, math);
    shift = shift + as_math(*args.table_shift, math);
  }
  return n * (1.0 + scale) + shift;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_cpu(const at::Tensor& x,
                                                          const at::Tensor& residual,
                                                          const std::optional<at::Tensor>& weight,
                                                          double eps) {
  check_fused_add_rms_norm("fused_add_rms_norm", x, residual, weight);
  require_cpu("fused_add_rms_norm", x);
  const at::ScalarType math = math_type(x);
  const at::Tensor sum = (x.to(math) + residual.to(math)).to(x.scalar_type());
  at::Tensor out = rms(sum.to(math), eps);
  if (weight) {
    out = out * weight->to(math);
  }
  return {out.to(x.scalar_type()).contiguous(), sum.contiguous()};
}

void fused_add_rms_norm_inplace_cpu(at::Tensor& x, at::Tensor& residual,
                                    const std::optional<at::Tensor>& weight, double eps) {
  check_fused_add_rms_norm("fused_add_rms_norm_", x, residual, weight);
  require_cpu("fused_add_rms_norm_", x);
  auto [out, sum] = fused_add_rms_norm_cpu(x, residual, weight, eps);
  residual.copy_(sum);
  x.copy_(out);
}

at::Tensor layer_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, double eps) {
  check_layer_norm(x, weight, bias);
  require_cpu("layer_norm", x);
  const at::ScalarType math = math_type(x);
  at::Tensor out = centred(x.to(math), eps);
  if (weight) {
    out = out * weight->to(math);
  }
  if (bias) {
    out = out + bias->to(math);
  }
  return out.to(x.scalar_type()).contiguous();
}

at::Tensor adaln_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                     const std::optional<at::Tensor>& weight, double eps, c10::string_view norm,
                     const std::optional<at::Tensor>& table_scale,
                     const std::optional<at::Tensor>& table_shift) {
  const AdaLnArgs args = adaln_args(x, scale, shift, weight, norm, table_scale, table_shift);
  check_adaln(args);
  require_cpu("adaln", x);
  return modulate(x.to(math_type(x)), args, eps).to(x.scalar_type()).contiguous();
}

std::tuple<at::Tensor, at::Tensor> gated_adaln_cpu(
    const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const std::optional<at::Tensor>& weight, double eps,
    c10::string_view norm, const std::optional<at::Tensor>& table_gate,
    const std::optional<at::Tensor>& table_scale, const std::optional<at::Tensor>& table_shift) {
  const AdaLnArgs args = gated_adaln_args(h, y, gate, scale, shift, weight, norm, table_gate,
                                          table_scale, table_shift);
  check_adaln(args);
  if (!h.device().is_cpu()) {
    fail_value("gated_adaln", "h", "a CPU or CUDA tensor", h.device().str());
  }
  const at::ScalarType math = math_type(h);
  at::Tensor g = gate.to(math);
  if (table_gate) {
    g = g + table_gate->to(math);
  }
  const at::Tensor sum = (h.to(math) + y.to(math) * g).to(h.scalar_type());
  const at::Tensor out = modulate(sum.to(math), args, eps).to(h.scalar_type());
  return {sum.contiguous(), out.contiguous()};
}

at::Tensor rms_norm_gated_cpu(const at::Tensor& x, const at::Tensor& gate,
                              const std::optional<at::Tensor>& weight, double eps,
                              c10::string_view activation, bool norm_before_gate) {
  bool sigmoid = false;
  check_rms_norm_gated(x, gate, weight, activation, sigmoid);
  require_cpu("rms_norm_gated", x);
  const at::ScalarType math = math_type(x);
  const at::Tensor z = gate.to(math);
  const at::Tensor g = sigmoid ? at::sigmoid(z) : at::silu(z);
  at::Tensor n = norm_before_gate ? rms(x.to(math), eps)
                                  : rms((x.to(math) * g).to(x.scalar_type()).to(math), eps);
  if (weight) {
    n = n * weight->to(math);
  }
  if (norm_before_gate) {
    n = n * g;
  }
  return n.to(x.scalar_type()).contiguous();
}

}  // namespace kiln::torch_ops

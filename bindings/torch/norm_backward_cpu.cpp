// The CPU implementations of the norm backward ops are kiln's references: the closed-form
// gradients in plain ATen math, in fp32 (fp64 for fp64 input), rounding where the CUDA
// kernel rounds (each gradient once; parameter gradients after the fp32 sum over rows).
#include <ATen/ATen.h>

#include "bindings/torch/norm.h"
#include "bindings/torch/norm_backward.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void require_cpu(const std::string& op, const std::string& arg, const at::Tensor& x) {
  if (!x.device().is_cpu()) {
    fail_value(op, arg, "a CPU or CUDA tensor", x.device().str());
  }
}

at::ScalarType math_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A per-element product summed over every row: a [D] parameter gradient.
at::Tensor sum_rows(const at::Tensor& t) {
  return t.reshape({-1, t.size(-1)}).sum(0);
}

// The per-element gradients of one norm, in the math type: dx, and the products the
// parameter gradients sum (dn * xhat for weight, dy * n for scale).
struct RowGrads {
  at::Tensor dx;
  at::Tensor dn_xhat;
  at::Tensor dy_n;
  at::Tensor dy;
};

// `one_plus_scale` is undefined without modulation.
RowGrads row_grads(const at::Tensor& dy, const at::Tensor& x,
                   const std::optional<at::Tensor>& weight, const at::Tensor& one_plus_scale,
                   bool layer, double eps) {
  const at::ScalarType math = math_type(x);
  const at::Tensor xf = x.to(math);
  const at::Tensor dyf = dy.to(math);
  const at::Tensor centred = layer ? xf - xf.mean(-1, /*keepdim=*/true) : xf;
  const at::Tensor rstd = at::rsqrt(centred.pow(2).mean(-1, /*keepdim=*/true) + eps);
  const at::Tensor xhat = centred * rstd;
  const at::Tensor w = weight ? weight->to(math) : at::Tensor();
  const at::Tensor n = w.defined() ? xhat * w : xhat;
  const at::Tensor dn = one_plus_scale.defined() ? dyf * one_plus_scale : dyf;
  const at::Tensor g = w.defined() ? dn * w : dn;
  at::Tensor inner = g - xhat * (g * xhat).mean(-1, /*keepdim=*/true);
  if (layer) {
    inner = inner - g.mean(-1, /*keepdim=*/true);
  }
  return {inner * rstd, dn * xhat, dyf * n, dyf};
}

}  // namespace

GradPair rms_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, double eps,
                               bool weight_grad) {
  const std::string op = "rms_norm_backward";
  check_norm_backward(op, dy, x, "x", weight);
  require_cpu(op, "x", x);
  const RowGrads grads = row_grads(dy, x, weight, at::Tensor(), false, eps);
  std::optional<at::Tensor> dweight;
  if (weight && weight_grad) {
    dweight = sum_rows(grads.dn_xhat).to(x.scalar_type());
  }
  return {grads.dx.to(x.scalar_type()).contiguous(), dweight};
}

GradPair fused_add_rms_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& dr,
                                         const at::Tensor& r,
                                         const std::optional<at::Tensor>& weight, double eps,
                                         bool weight_grad) {
  const std::string op = "fused_add_rms_norm_backward";
  check_norm_backward(op, dy, r, "r", weight);
  check_same_as(op, "dr", dr, "r", r);
  require_cpu(op, "r", r);
  const RowGrads grads = row_grads(dy, r, weight, at::Tensor(), false, eps);
  std::optional<at::Tensor> dweight;
  if (weight && weight_grad) {
    dweight = sum_rows(grads.dn_xhat).to(r.scalar_type());
  }
  const at::Tensor dx = grads.dx + dr.to(math_type(r));
  return {dx.to(r.scalar_type()).contiguous(), dweight};
}

GradTriple layer_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& bias, double eps,
                                   bool weight_grad, bool bias_grad) {
  const std::string op = "layer_norm_backward";
  check_norm_backward(op, dy, x, "x", weight);
  if (bias) {
    check_parameter(op, "bias", *bias, x);
  }
  require_cpu(op, "x", x);
  const RowGrads grads = row_grads(dy, x, weight, at::Tensor(), true, eps);
  std::optional<at::Tensor> dweight;
  std::optional<at::Tensor> dbias;
  if (weight && weight_grad) {
    dweight = sum_rows(grads.dn_xhat).to(x.scalar_type());
  }
  if (bias && bias_grad) {
    dbias = sum_rows(grads.dy).to(x.scalar_type());
  }
  return {grads.dx.to(x.scalar_type()).contiguous(), dweight, dbias};
}

AdaLnGrads adaln_backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                              const std::optional<at::Tensor>& weight, double eps,
                              c10::string_view norm, const std::optional<at::Tensor>& table_scale,
                              bool shift_per_token, bool scale_grad, bool shift_grad,
                              bool weight_grad, bool table_scale_grad, bool table_shift_grad) {
  const std::string op = "adaln_backward";
  const std::string kind(norm);
  check_adaln_backward(dy, x, scale, weight, kind, table_scale);
  require_cpu(op, "x", x);
  const at::ScalarType math = math_type(x);
  const at::ScalarType dtype = x.scalar_type();
  at::Tensor one_plus_scale = scale.to(math) + 1.0;
  if (table_scale) {
    one_plus_scale = one_plus_scale + table_scale->to(math);
  }
  const bool layer = parse_norm_kind(op, kind);
  const RowGrads grads = row_grads(dy, x, weight, one_plus_scale, layer, eps);
  const bool scale_per_token = per_token_operand(scale, x);
  std::optional<at::Tensor> dscale;
  if (scale_grad) {
    dscale =
        (scale_per_token ? grads.dy_n : grads.dy_n.sum(1, /*keepdim=*/true)).to(dtype).contiguous();
  }
  std::optional<at::Tensor> dshift;
  if (shift_grad && !shift_per_token) {
    dshift = grads.dy.sum(1, /*keepdim=*/true).to(dtype).contiguous();
  }
  std::optional<at::Tensor> dweight;
  if (weight && weight_grad) {
    dweight = sum_rows(grads.dn_xhat).to(dtype);
  }
  std::optional<at::Tensor> dtable_scale;
  if (table_scale_grad) {
    dtable_scale = sum_rows(grads.dy_n).to(dtype);
  }
  std::optional<at::Tensor> dtable_shift;
  if (table_shift_grad) {
    dtable_shift = sum_rows(grads.dy).to(dtype);
  }
  return {grads.dx.to(dtype).contiguous(), dscale, dshift, dweight, dtable_scale, dtable_shift};
}

}  // namespace kiln::torch_ops

// The autograd kernels of rms_norm, fused_add_rms_norm, layer_norm and adaln: without grad
// they call the op below autograd at once; with it, a torch::autograd::Function whose
// backward is the op's backward kernel (norm_backward.h).
//
// The forwards save their inputs, not their row statistics: the backward kernels recompute
// mean and rstd from x, which they read anyway.
#include <torch/library.h>

#include "bindings/torch/autograd_support.h"
#include "bindings/torch/norm.h"
#include "bindings/torch/norm_backward.h"
#include "bindings/torch/rms_norm.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

// ---- rms_norm(x, weight, eps)

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight, double eps) {
    ctx->save_for_backward({x, value_or_undefined(weight)});
    ctx->saved_data["eps"] = eps;
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<rms_norm_cpu>("kiln::rms_norm").call(x, weight, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool weight_grad = wants_grad(ctx, {true, saved[1].defined()}, 1);
    auto [dx, dweight] = kiln_op<rms_norm_backward_cpu>("kiln::rms_norm_backward")
                             .call(grads[0], saved[0], present(saved[1]),
                                   ctx->saved_data["eps"].toDouble(), weight_grad);
    return {dx, value_or_undefined(dweight), at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             double eps) {
  refuse_tangents(kiln_op<rms_norm_cpu>("kiln::rms_norm"), x, weight, eps);
  if (!records_grad(x, weight)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<rms_norm_cpu>("kiln::rms_norm").call(x, weight, eps);
  }
  return RmsNormFunction::apply(x, weight, eps);
}

// ---- fused_add_rms_norm(x, residual, weight, eps) -> (y, r), r = x + residual

struct FusedAddRmsNormFunction : torch::autograd::Function<FusedAddRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                               double eps) {
    // An output nobody used gets no gradient (undefined), not a tensor of zeros.
    ctx->set_materialize_grads(false);
    at::Tensor y;
    at::Tensor r;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(y, r) = kiln_op<fused_add_rms_norm_cpu>("kiln::fused_add_rms_norm")
                           .call(x, residual, weight, eps);
    }
    ctx->save_for_backward({r, value_or_undefined(weight)});
    ctx->saved_data["eps"] = eps;
    return {y, r};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& dy = grads[0];
    const at::Tensor& dr = grads[1];
    const std::optional<at::Tensor> weight = present(saved[1]);
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool weight_grad = wants_grad(ctx, {true, true, weight.has_value()}, 2);
    // x and residual both receive d(x + residual): dr, plus what flows back through y.
    at::Tensor dsum;
    std::optional<at::Tensor> dweight;
    if (!dy.defined()) {
      dsum = dr;
    } else if (!dr.defined()) {
      std::tie(dsum, dweight) = kiln_op<rms_norm_backward_cpu>("kiln::rms_norm_backward")
                                    .call(dy, saved[0], weight, eps, weight_grad);
    } else {
      std::tie(dsum, dweight) =
          kiln_op<fused_add_rms_norm_backward_cpu>("kiln::fused_add_rms_norm_backward")
              .call(dy, dr, saved[0], weight, eps, weight_grad);
    }
    return {dsum, dsum, value_or_undefined(dweight), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_autograd(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps) {
  refuse_tangents(kiln_op<fused_add_rms_norm_cpu>("kiln::fused_add_rms_norm"), x, residual, weight,
                  eps);
  if (!records_grad(x, residual, weight)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<fused_add_rms_norm_cpu>("kiln::fused_add_rms_norm")
        .call(x, residual, weight, eps);
  }
  variable_list outputs = FusedAddRmsNormFunction::apply(x, residual, weight, eps);
  return {outputs[0], outputs[1]};
}

// ---- layer_norm(x, weight, bias, eps)

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, double eps) {
    ctx->save_for_backward({x, value_or_undefined(weight), value_or_undefined(bias)});
    ctx->saved_data["eps"] = eps;
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<layer_norm_cpu>("kiln::layer_norm").call(x, weight, bias, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::initializer_list<bool> given{true, saved[1].defined(), saved[2].defined()};
    auto [dx, dweight, dbias] = kiln_op<layer_norm_backward_cpu>("kiln::layer_norm_backward")
                                    .call(grads[0], saved[0], present(saved[1]), present(saved[2]),
                                          ctx->saved_data["eps"].toDouble(),
                                          wants_grad(ctx, given, 1), wants_grad(ctx, given, 2));
    return {dx, value_or_undefined(dweight), value_or_undefined(dbias), at::Tensor()};
  }
};

at::Tensor layer_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
  refuse_tangents(kiln_op<layer_norm_cpu>("kiln::layer_norm"), x, weight, bias, eps);
  if (!records_grad(x, weight, bias)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<layer_norm_cpu>("kiln::layer_norm").call(x, weight, bias, eps);
  }
  return LayerNormFunction::apply(x, weight, bias, eps);
}

// ---- adaln(x, scale, shift, weight, eps, norm, table_scale, table_shift)

// Only the gradients autograd asks for are computed: with the modulation and the norm's
// parameters frozen (LoRA), the backward is dx alone. A table row's gradient (the operand's
// summed over samples and tokens) is the backward op's own output (see adaln_backward).
struct AdaLnFunction : torch::autograd::Function<AdaLnFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& shift, const std::optional<at::Tensor>& weight,
                            double eps, c10::string_view norm,
                            const std::optional<at::Tensor>& table_scale,
                            const std::optional<at::Tensor>& table_shift) {
    ctx->save_for_backward({x, scale, value_or_undefined(weight), value_or_undefined(table_scale)});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["norm"] = std::string(norm);
    // A per-token shift's gradient is dy itself; a per-sample one is dy summed per sample.
    ctx->saved_data["shift_per_token"] =
        shift.dim() > 1 && x.dim() > 1 && per_token_operand(shift, x);
    ctx->saved_data["table_shift"] = table_shift.has_value();
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<adaln_cpu>("kiln::adaln")
        .call(x, scale, shift, weight, eps, norm, table_scale, table_shift);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& dy = grads[0];
    const bool shift_per_token = ctx->saved_data["shift_per_token"].toBool();
    const std::string norm = ctx->saved_data["norm"].toStringRef();
    // x, scale, shift, weight, table_scale, table_shift
    const std::initializer_list<bool> given{true,
                                            true,
                                            true,
                                            saved[2].defined(),
                                            saved[3].defined(),
                                            ctx->saved_data["table_shift"].toBool()};
    const bool shift_grad = wants_grad(ctx, given, 2);
    auto [dx, dscale, dshift, dweight, dtable_scale, dtable_shift] =
        kiln_op<adaln_backward_cpu>("kiln::adaln_backward")
            .call(dy, saved[0], saved[1], present(saved[2]), ctx->saved_data["eps"].toDouble(),
                  norm, present(saved[3]), shift_per_token, wants_grad(ctx, given, 1),
                  shift_grad && !shift_per_token, wants_grad(ctx, given, 3),
                  wants_grad(ctx, given, 4), wants_grad(ctx, given, 5));
    const at::Tensor shift_gradient =
        !shift_grad ? at::Tensor() : (shift_per_token ? dy : value_or_undefined(dshift));
    return {dx,
            value_or_undefined(dscale),
            shift_gradient,
            value_or_undefined(dweight),
            at::Tensor(),
            at::Tensor(),
            value_or_undefined(dtable_scale),
            value_or_undefined(dtable_shift)};
  }
};

at::Tensor adaln_autograd(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                          const std::optional<at::Tensor>& weight, double eps,
                          c10::string_view norm, const std::optional<at::Tensor>& table_scale,
                          const std::optional<at::Tensor>& table_shift) {
  refuse_tangents(kiln_op<adaln_cpu>("kiln::adaln"), x, scale, shift, weight, eps, norm,
                  table_scale, table_shift);
  if (!records_grad(x, scale, shift, weight, table_scale, table_shift)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<adaln_cpu>("kiln::adaln")
        .call(x, scale, shift, weight, eps, norm, table_scale, table_shift);
  }
  // The backward kernels take table rows of x's dtype only.
  if (table_scale.has_value() && table_scale->scalar_type() == at::kFloat &&
      x.scalar_type() != at::kFloat) {
    fail_type("adaln", "table_scale",
              "dtype " + dtype_text(x.scalar_type()) +
                  " (as x) where autograd records the call (fp32 table rows beside 16-bit x "
                  "have no backward)",
              dtype_text(table_scale->scalar_type()));
  }
  return AdaLnFunction::apply(x, scale, shift, weight, eps, norm, table_scale, table_shift);
}

}  // namespace
}  // namespace kiln::torch_ops

TORCH_LIBRARY_IMPL(kiln, Autograd, m) {
  m.impl("rms_norm", &kiln::torch_ops::rms_norm_autograd);
  m.impl("fused_add_rms_norm", &kiln::torch_ops::fused_add_rms_norm_autograd);
  m.impl("layer_norm", &kiln::torch_ops::layer_norm_autograd);
  m.impl("adaln", &kiln::torch_ops::adaln_autograd);
}

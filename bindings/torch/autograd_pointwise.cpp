// The autograd kernels of rope, swiglu, geglu, gelu and clamped_swiglu: without grad they call the
// op below autograd at once; with it, a torch::autograd::Function whose backward is the op's
// backward kernel (rope.h, activation_backward.h, clamped_swiglu.h).
//
// Each forward keeps only what its backward reads (rope: cos and sin, never q or k; the
// activations: their inputs). RoPE gives no gradient to cos and sin (tables built from
// positions, not trained); a cos or sin that requires grad is treated as a constant.
#include <torch/library.h>

#include "bindings/torch/activation.h"
#include "bindings/torch/activation_backward.h"
#include "bindings/torch/autograd_support.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/rope.h"

namespace kiln::torch_ops {
namespace {

// ---- rope(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave) -> (q, k)

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                               std::int64_t rotary_dim, std::string_view layout,
                               std::int64_t head_dim, bool deinterleave) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["deinterleave"] = deinterleave;
    ctx->saved_data["rotary_dim"] = rotary_dim;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["head_dim"] = head_dim;
    const at::AutoDispatchBelowADInplaceOrView below;
    auto [q_out, k_out] =
        kiln_op<rope_cpu>("kiln::rope")
            .call(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave);
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string layout = ctx->saved_data["layout"].toStringRef();
    auto [dq, dk] =
        kiln_op<rope_backward_cpu>("kiln::rope_backward")
            .call(grads[0], grads[1], saved[0], saved[1], ctx->saved_data["interleaved"].toBool(),
                  ctx->saved_data["rotary_dim"].toInt(), layout,
                  ctx->saved_data["head_dim"].toInt(), ctx->saved_data["deinterleave"].toBool());
    return {dq,           dk,           at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

TensorPair rope_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                         const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                         std::string_view layout, std::int64_t head_dim, bool deinterleave) {
  // cos and sin are constants to RoPE's derivatives, forward as backward.
  refuse_tangents(kiln_op<rope_cpu>("kiln::rope"), q, k);
  if (!records_grad(q, k)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<rope_cpu>("kiln::rope")
        .call(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave);
  }
  variable_list outputs =
      RopeFunction::apply(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave);
  return {outputs[0], outputs[1]};
}

// ---- swiglu(gate, up, up_first) and geglu(gate, up, approximate, up_first)

// The gated ops' gradients as the forward's inputs: [dgate, dup] for two tensors, or one
// gradient in the packed gate_up tensor's layout (up absent).
variable_list gated_gradients(const std::vector<at::Tensor>& grads, std::size_t arguments) {
  variable_list result(arguments);
  result[0] = grads[0];
  if (grads.size() > 1) {
    result[1] = grads[1];
  }
  return result;
}

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate,
                            const std::optional<at::Tensor>& up, bool up_first) {
    ctx->save_for_backward({gate, value_or_undefined(up)});
    ctx->saved_data["up_first"] = up_first;
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<swiglu_cpu>("kiln::swiglu").call(gate, up, up_first);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return gated_gradients(
        kiln_op<swiglu_backward_cpu>("kiln::swiglu_backward")
            .call(grads[0], saved[0], present(saved[1]), ctx->saved_data["up_first"].toBool()),
        3);
  }
};

at::Tensor swiglu_autograd(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                           bool up_first) {
  refuse_tangents(kiln_op<swiglu_cpu>("kiln::swiglu"), gate, up);
  if (!records_grad(gate, up)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<swiglu_cpu>("kiln::swiglu").call(gate, up, up_first);
  }
  return SwigluFunction::apply(gate, up, up_first);
}

struct GegluFunction : torch::autograd::Function<GegluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate,
                            const std::optional<at::Tensor>& up, c10::string_view approximate,
                            bool up_first) {
    ctx->save_for_backward({gate, value_or_undefined(up)});
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->saved_data["up_first"] = up_first;
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<geglu_cpu>("kiln::geglu").call(gate, up, approximate, up_first);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return gated_gradients(kiln_op<geglu_backward_cpu>("kiln::geglu_backward")
                               .call(grads[0], saved[0], present(saved[1]), approximate,
                                     ctx->saved_data["up_first"].toBool()),
                           4);
  }
};

at::Tensor geglu_autograd(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                          c10::string_view approximate, bool up_first) {
  refuse_tangents(kiln_op<geglu_cpu>("kiln::geglu"), gate, up);
  if (!records_grad(gate, up)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<geglu_cpu>("kiln::geglu").call(gate, up, approximate, up_first);
  }
  return GegluFunction::apply(gate, up, approximate, up_first);
}

// ---- gelu(x, bias, approximate)

struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& bias, c10::string_view approximate) {
    ctx->save_for_backward({x, value_or_undefined(bias)});
    ctx->saved_data["approximate"] = std::string(approximate);
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<gelu_cpu>("kiln::gelu").call(x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    const std::vector<at::Tensor> gradients =
        kiln_op<gelu_backward_cpu>("kiln::gelu_backward")
            .call(grads[0], saved[0], present(saved[1]), approximate);
    return {gradients[0], gradients.size() > 1 ? gradients[1] : at::Tensor(), at::Tensor()};
  }
};

at::Tensor gelu_autograd(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                         c10::string_view approximate) {
  refuse_tangents(kiln_op<gelu_cpu>("kiln::gelu"), x, bias);
  if (!records_grad(x, bias)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<gelu_cpu>("kiln::gelu").call(x, bias, approximate);
  }
  return GeluFunction::apply(x, bias, approximate);
}

// ---- clamped_swiglu(gate_up, alpha, limit, interleaved)

struct ClampedSwigluFunction : torch::autograd::Function<ClampedSwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up, double alpha,
                            double limit, bool interleaved) {
    ctx->save_for_backward({gate_up});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["interleaved"] = interleaved;
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<clamped_swiglu_cpu>("kiln::clamped_swiglu")
        .call(gate_up, alpha, limit, interleaved);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor grad =
        kiln_op<clamped_swiglu_backward_cpu>("kiln::clamped_swiglu_backward")
            .call(grads[0], saved[0], ctx->saved_data["alpha"].toDouble(),
                  ctx->saved_data["limit"].toDouble(), ctx->saved_data["interleaved"].toBool());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor clamped_swiglu_autograd(const at::Tensor& gate_up, double alpha, double limit,
                                   bool interleaved) {
  refuse_tangents(kiln_op<clamped_swiglu_cpu>("kiln::clamped_swiglu"), gate_up);
  if (!records_grad(gate_up)) {
    const at::AutoDispatchBelowADInplaceOrView below;
    return kiln_op<clamped_swiglu_cpu>("kiln::clamped_swiglu")
        .call(gate_up, alpha, limit, interleaved);
  }
  return ClampedSwigluFunction::apply(gate_up, alpha, limit, interleaved);
}

}  // namespace
}  // namespace kiln::torch_ops

TORCH_LIBRARY_IMPL(kiln, Autograd, m) {
  m.impl("clamped_swiglu", &kiln::torch_ops::clamped_swiglu_autograd);
  m.impl("rope", &kiln::torch_ops::rope_autograd);
  m.impl("swiglu", &kiln::torch_ops::swiglu_autograd);
  m.impl("geglu", &kiln::torch_ops::geglu_autograd);
  m.impl("gelu", &kiln::torch_ops::gelu_autograd);
}

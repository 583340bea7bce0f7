// head_norm_rope: the per-head q/k RMSNorm that Qwen3, Gemma 3 and FLUX apply before their
// RoPE, fused with it. The CPU implementation is the reference (the norm in fp32, rounded to
// q's dtype, then rope's reference); the CUDA one is kiln::rope with its HEAD_NORM pass.
#include <ATen/ATen.h>

#include "bindings/torch/rope.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {

namespace {

const std::string kOp = "head_norm_rope";

// q, k, cos and sin as rope checks them, and each weight a [D] tensor of q's dtype and device.
RopeShape head_norm_shape(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                          const std::optional<at::Tensor>& q_weight,
                          const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                          const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                          const std::string& layout, std::int64_t head_dim) {
  const RopeShape shape = rope_shape(op, q, k, cos, sin, interleaved, rotary_dim, layout, head_dim);
  const std::int64_t d = shape.d;
  for (const auto& [arg, weight] :
       {std::pair{"q_weight", &q_weight}, std::pair{"k_weight", &k_weight}}) {
    if (!weight->has_value()) {
      continue;
    }
    const at::Tensor& w = **weight;
    if (w.scalar_type() != q.scalar_type()) {
      fail_type(op, arg, "dtype " + dtype_text(q.scalar_type()) + " (as q)",
                dtype_text(w.scalar_type()));
    }
    if (w.device() != q.device()) {
      fail_value(op, arg, "device " + q.device().str() + " (as q)", w.device().str());
    }
    if (w.dim() != 1 || w.size(0) != d) {
      fail_value(op, arg, "[" + std::to_string(d) + "] (the head dim)", shape_text(w));
    }
  }
  return shape;
}

HeadNormArgs norm_args(const std::optional<at::Tensor>& q_weight,
                       const std::optional<at::Tensor>& k_weight, double eps) {
  HeadNormArgs norm;
  if (q_weight) {
    norm.q_weight = *q_weight;
  }
  if (k_weight) {
    norm.k_weight = *k_weight;
  }
  norm.eps = eps;
  return norm;
}

// x (of q's or k's shape) with each head normalised and rounded to x's dtype: what the
// models' separate norm modules hand to their RoPE.
at::Tensor normalised_heads(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                            double eps, const std::string& layout, std::int64_t d) {
  const at::Tensor x4 = rope_view(x, layout, d);
  const at::Tensor xf = x4.to(reference_math_type(x));
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  if (weight) {
    y = y * weight->to(xf.scalar_type());
  }
  at::Tensor out = rope_output(x);
  rope_view(out, layout, d).copy_(y.to(x.scalar_type()));
  return out;
}

void require_device(const std::string& op, const at::Tensor& q, bool cuda) {
  if (cuda ? !q.is_cuda() : !q.device().is_cpu()) {
    fail_value(op, "q", cuda ? "a CUDA tensor" : "a CPU or CUDA tensor", q.device().str());
  }
}

TensorPair reference(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                     const std::optional<at::Tensor>& q_weight,
                     const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                     const at::Tensor& sin, double eps, bool interleaved, std::int64_t rotary_dim,
                     std::string_view layout, std::int64_t head_dim) {
  const std::string lay(layout);
  const RopeShape shape = head_norm_shape(op, q, k, q_weight, k_weight, cos, sin, interleaved,
                                          rotary_dim, lay, head_dim);
  require_device(op, q, false);
  const std::int64_t d = shape.d;
  return rope_cpu(normalised_heads(q, q_weight, eps, lay, d),
                  normalised_heads(k, k_weight, eps, lay, d), cos, sin, interleaved, rotary_dim,
                  layout, d, /*deinterleave=*/false);
}

}  // namespace

TensorPair head_norm_rope_cpu(const at::Tensor& q, const at::Tensor& k,
                              const std::optional<at::Tensor>& q_weight,
                              const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                              const at::Tensor& sin, double eps, bool interleaved,
                              std::int64_t rotary_dim, std::string_view layout,
                              std::int64_t head_dim) {
  return reference(kOp, q, k, q_weight, k_weight, cos, sin, eps, interleaved, rotary_dim, layout,
                   head_dim);
}

TensorPair head_norm_rope_cuda(const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& q_weight,
                               const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, double eps, bool interleaved,
                               std::int64_t rotary_dim, std::string_view layout,
                               std::int64_t head_dim) {
  const std::string lay(layout);
  const RopeShape shape = head_norm_shape(kOp, q, k, q_weight, k_weight, cos, sin, interleaved,
                                          rotary_dim, lay, head_dim);
  require_device(kOp, q, true);
  at::Tensor q_out = rope_output(q);
  at::Tensor k_out = rope_output(k);
  const HeadNormArgs norm = norm_args(q_weight, k_weight, eps);
  rope_launch_table(kOp, shape, q, k, cos, sin, lay, q_out, k_out, /*inverse=*/false, &norm);
  return {q_out, k_out};
}

void head_norm_rope_inplace_cpu(const at::Tensor& q, const at::Tensor& k,
                                const std::optional<at::Tensor>& q_weight,
                                const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                                const at::Tensor& sin, double eps, bool interleaved,
                                std::int64_t rotary_dim, std::string_view layout,
                                std::int64_t head_dim) {
  auto [q_out, k_out] = reference(kOp + "_", q, k, q_weight, k_weight, cos, sin, eps, interleaved,
                                  rotary_dim, layout, head_dim);
  q.copy_(q_out);
  k.copy_(k_out);
}

void head_norm_rope_inplace_cuda(const at::Tensor& q, const at::Tensor& k,
                                 const std::optional<at::Tensor>& q_weight,
                                 const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                                 const at::Tensor& sin, double eps, bool interleaved,
                                 std::int64_t rotary_dim, std::string_view layout,
                                 std::int64_t head_dim) {
  const std::string lay(layout);
  const std::string op = kOp + "_";
  const RopeShape shape = head_norm_shape(op, q, k, q_weight, k_weight, cos, sin, interleaved,
                                          rotary_dim, lay, head_dim);
  require_device(op, q, true);
  if (q.stride(-1) != 1 || k.stride(-1) != 1) {
    // Rows not addressable in place (a strided last dimension): normalise and rotate a copy.
    auto [q_out, k_out] = head_norm_rope_cuda(q, k, q_weight, k_weight, cos, sin, eps, interleaved,
                                              rotary_dim, layout, head_dim);
    q.copy_(q_out);
    k.copy_(k_out);
    return;
  }
  // Each element is read by the thread that overwrites it, after its row's sum has met.
  const HeadNormArgs norm = norm_args(q_weight, k_weight, eps);
  rope_launch_table(op, shape, q, k, cos, sin, lay, q, k, /*inverse=*/false, &norm);
}

}  // namespace kiln::torch_ops

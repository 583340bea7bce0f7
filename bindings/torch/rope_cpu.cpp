// The CPU implementations are kiln's references: plain ATen math in fp32, the formulas of
// transformers (rotate_half) and diffusers (interleaved pairs, LTX-Video's table).
#include <ATen/ATen.h>

#include <cmath>

#include "bindings/torch/rope.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {

namespace {

void require_cpu(const std::string& op, const at::Tensor& q, const std::string& arg = "q") {
  if (!q.device().is_cpu()) fail_value(op, arg, "a CPU or CUDA tensor", q.device().str());
}

std::vector<std::int64_t> to_vector(at::IntArrayRef values) {
  return {values.begin(), values.end()};
}

std::optional<std::vector<double>> to_vector(std::optional<at::ArrayRef<double>> values) {
  if (!values) return std::nullopt;
  return std::vector<double>(values->begin(), values->end());
}

}  // namespace

void rope_reference(const at::Tensor& x4, const at::Tensor& cos3, const at::Tensor& sin3,
                    std::int64_t rotary_dim, bool interleaved, const at::Tensor& out4, bool inverse,
                    bool deinterleave) {
  const at::ScalarType math = reference_math_type(x4);
  const at::Tensor x = x4.to(math);
  // A half table's angle of each pair, spelled out for both of the pair's elements.
  const auto full = [&](const at::Tensor& t) {
    if (t.size(-1) == rotary_dim) return t;
    return interleaved ? t.repeat_interleave(2, -1) : at::cat({t, t}, -1);
  };
  const at::Tensor c = full(cos3.to(math)).unsqueeze(2);  // [B, S, 1, R]
  const at::Tensor s = full(sin3.to(math)).unsqueeze(2);
  at::Tensor rot = x.narrow(-1, 0, rotary_dim);
  if (deinterleave && !inverse) {
    // DeepSeek-V3's apply_rotary_pos_emb_interleave: pairs (2j, 2j + 1) rotate as (j, j + R/2).
    const at::Tensor pairs = rot.unflatten(-1, {rotary_dim / 2, 2});
    rot = at::cat({pairs.select(-1, 0), pairs.select(-1, 1)}, -1);
  }
  // J, the 90-degree turn of each rotation pair: out = x * cos + J(x) * sin, and its
  // transpose (J^T = -J) x * cos - J(x * sin).
  const auto turn = [&](const at::Tensor& z) {
    if (interleaved) {
      const at::Tensor pairs = z.unflatten(-1, {rotary_dim / 2, 2});
      return at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
    }
    const at::Tensor first = z.narrow(-1, 0, rotary_dim / 2);
    const at::Tensor second = z.narrow(-1, rotary_dim / 2, rotary_dim / 2);
    return at::cat({-second, first}, -1);
  };
  at::Tensor rotated = inverse ? rot * c - turn(rot * s) : rot * c + turn(rot) * s;
  if (deinterleave && inverse) {
    // The transpose: the gradient of column j + R/2 goes back to column 2j + 1.
    rotated = at::stack({rotated.narrow(-1, 0, rotary_dim / 2),
                         rotated.narrow(-1, rotary_dim / 2, rotary_dim / 2)},
                        -1)
                  .flatten(-2);
  }
  const std::int64_t rest = x.size(-1) - rotary_dim;
  out4.narrow(-1, 0, rotary_dim).copy_(rotated);
  if (rest > 0 && !out4.is_same(x4))
    out4.narrow(-1, rotary_dim, rest).copy_(x4.narrow(-1, rotary_dim, rest));
}

std::pair<at::Tensor, at::Tensor> video_table(std::int64_t dim,
                                              const std::vector<std::int64_t>& grid,
                                              const std::optional<std::vector<double>>& scale,
                                              const std::vector<std::int64_t>& base_sizes,
                                              const std::vector<std::int64_t>& patch_sizes,
                                              double theta, const c10::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  std::vector<at::Tensor> axes = at::meshgrid(
      {at::arange(grid[0], f32), at::arange(grid[1], f32), at::arange(grid[2], f32)}, "ij");
  at::Tensor coords = at::stack(axes, 0);  // [3, F, H, W]
  if (scale) {
    const double patch[3] = {double(patch_sizes[0]), double(patch_sizes[1]),
                             double(patch_sizes[1])};
    for (int a = 0; a < 3; ++a) {
      coords[a] = coords[a] * (*scale)[a] * patch[a] / double(base_sizes[a]);
    }
  }
  coords = coords.flatten(1).transpose(0, 1);  // [S, 3]
  at::Tensor freqs = at::pow(theta, at::linspace(0.0, 1.0, dim / 6, f32));
  freqs = freqs * (M_PI / 2.0);
  freqs = freqs * (coords.unsqueeze(-1) * 2 - 1);  // [S, 3, n]
  freqs = freqs.transpose(-1, -2).flatten(1);      // [S, 3n], pair j = 3 i + axis
  at::Tensor cos = freqs.cos().repeat_interleave(2, -1);
  at::Tensor sin = freqs.sin().repeat_interleave(2, -1);
  if (dim % 6 != 0) {
    cos = at::cat({at::ones({cos.size(0), dim % 6}, f32), cos}, -1);
    sin = at::cat({at::zeros({sin.size(0), dim % 6}, f32), sin}, -1);
  }
  return {cos.unsqueeze(0), sin.unsqueeze(0)};
}

TensorPair rope_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                    std::string_view layout, std::int64_t head_dim, bool deinterleave) {
  const std::string lay(layout);
  check_deinterleave("rope", interleaved, deinterleave);
  const RopeOperands r =
      rope_operands("rope", q, k, cos, sin, interleaved, rotary_dim, lay, head_dim);
  require_cpu("rope", q);
  at::Tensor q_out = rope_output(q);
  at::Tensor k_out = rope_output(k);
  const std::int64_t d = r.q4.size(3);
  rope_reference(r.q4, r.cos3, r.sin3, r.rotary_dim, interleaved, rope_view(q_out, lay, d), false,
                 deinterleave);
  rope_reference(r.k4, r.cos3, r.sin3, r.rotary_dim, interleaved, rope_view(k_out, lay, d), false,
                 deinterleave);
  return {q_out, k_out};
}

TensorPair rope_backward_cpu(const at::Tensor& grad_q, const at::Tensor& grad_k,
                             const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                             std::int64_t rotary_dim, std::string_view layout,
                             std::int64_t head_dim, bool deinterleave) {
  const std::string lay(layout);
  check_deinterleave("rope_backward", interleaved, deinterleave);
  const RopeOperands r = rope_operands("rope_backward", grad_q, grad_k, cos, sin, interleaved,
                                       rotary_dim, lay, head_dim, "grad_q", "grad_k");
  require_cpu("rope_backward", grad_q, "grad_q");
  at::Tensor dq = rope_output(grad_q);
  at::Tensor dk = rope_output(grad_k);
  const std::int64_t d = r.q4.size(3);
  rope_reference(r.q4, r.cos3, r.sin3, r.rotary_dim, interleaved, rope_view(dq, lay, d), true,
                 deinterleave);
  rope_reference(r.k4, r.cos3, r.sin3, r.rotary_dim, interleaved, rope_view(dk, lay, d), true,
                 deinterleave);
  return {dq, dk};
}

void rope_inplace_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                      const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                      std::string_view layout, std::int64_t head_dim, bool deinterleave) {
  auto [q_out, k_out] =
      rope_cpu(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave);
  q.copy_(q_out);
  k.copy_(k_out);
}

namespace {

void check_video_args(const std::string& op, at::IntArrayRef grid,
                      std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                      at::IntArrayRef patch_sizes, std::int64_t seq) {
  if (grid.size() != 3)
    fail_value(op, "grid", "3 sizes (frames, height, width)",
               std::to_string(grid.size()) + " values");
  if (grid[0] * grid[1] * grid[2] != seq) {
    fail_value(op, "grid", "frames * height * width = the sequence length " + std::to_string(seq),
               std::to_string(grid[0]) + " x " + std::to_string(grid[1]) + " x " +
                   std::to_string(grid[2]));
  }
  if (scale && scale->size() != 3)
    fail_value(op, "rope_interpolation_scale", "3 values",
               std::to_string(scale->size()) + " values");
  if (base_sizes.size() != 3)
    fail_value(op, "base_sizes", "3 values", std::to_string(base_sizes.size()) + " values");
  if (patch_sizes.size() != 2)
    fail_value(op, "patch_sizes", "2 values (patch_size_t, patch_size)",
               std::to_string(patch_sizes.size()) + " values");
}

}  // namespace

void check_rope_3d(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                   std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                   at::IntArrayRef patch_sizes) {
  kiln_dtype("rope_3d", "q", q);
  if (k.scalar_type() != q.scalar_type()) {
    fail_type("rope_3d", "k", "dtype " + dtype_text(q.scalar_type()) + " (as q)",
              dtype_text(k.scalar_type()));
  }
  if (k.device() != q.device())
    fail_value("rope_3d", "k", "device " + q.device().str() + " (as q)", k.device().str());
  if (q.dim() != 3) fail_value("rope_3d", "q", "3 dimensions [B, S, C]", shape_text(q));
  if (k.sizes() != q.sizes())
    fail_value("rope_3d", "k", "q's shape " + shape_text(q), shape_text(k));
  if (q.size(2) < 6 || q.size(2) % 2 != 0)
    fail_value("rope_3d", "q", "an even width C >= 6", shape_text(q));
  check_video_args("rope_3d", grid, scale, base_sizes, patch_sizes, q.size(1));
}

TensorPair rope_3d_cpu(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                       std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                       at::IntArrayRef patch_sizes, double theta) {
  check_rope_3d(q, k, grid, scale, base_sizes, patch_sizes);
  require_cpu("rope_3d", q);
  const auto [cos, sin] =
      video_table(q.size(2), to_vector(grid), to_vector(scale), to_vector(base_sizes),
                  to_vector(patch_sizes), theta, q.device());
  return rope_cpu(q, k, cos, sin, true, -1, "bshd", -1, false);
}

void check_rms_norm_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                         const at::Tensor& k_weight, const std::optional<at::Tensor>& cos,
                         const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                         std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                         at::IntArrayRef patch_sizes, std::int64_t head_dim) {
  const std::string op = "rms_norm_rope";
  kiln_dtype(op, "q", q);
  if (k.scalar_type() != q.scalar_type()) {
    fail_type(op, "k", "dtype " + dtype_text(q.scalar_type()) + " (as q)",
              dtype_text(k.scalar_type()));
  }
  if (k.device() != q.device())
    fail_value(op, "k", "device " + q.device().str() + " (as q)", k.device().str());
  if (q.dim() != 3) fail_value(op, "q", "3 dimensions [B, S, C]", shape_text(q));
  if (k.sizes() != q.sizes()) fail_value(op, "k", "q's shape " + shape_text(q), shape_text(k));
  if (q.size(2) < 6 || q.size(2) % 2 != 0)
    fail_value(op, "q", "an even width C >= 6", shape_text(q));
  check_parameter(op, "q_weight", q_weight, q);
  check_parameter(op, "k_weight", k_weight, q);
  if (grid.has_value() == (cos.has_value() || sin.has_value())) {
    fail_value(op, "cos", "either cos and sin or a video grid (one of them)",
               grid ? "both" : "neither");
  }
  if (cos.has_value() != sin.has_value())
    fail_value(op, "sin", "given together with cos", "only one of them");
  if (grid) check_video_args(op, *grid, scale, base_sizes, patch_sizes, q.size(1));
  if (head_dim != -1) {
    if (grid) fail_value(op, "head_dim", "-1 with a video grid", std::to_string(head_dim));
    // A multiple of 4: the kernel's vectors hold whole pairs of q and of the half table's rows.
    if (head_dim < 4 || head_dim % 4 != 0 || q.size(2) % head_dim != 0) {
      fail_value(op, "head_dim",
                 "-1 or a multiple of 4 dividing q's width " + std::to_string(q.size(2)),
                 std::to_string(head_dim));
    }
    if (cos && cos->size(-1) != head_dim / 2) {
      fail_value(op, "cos",
                 "a last dimension of head_dim / 2 = " + std::to_string(head_dim / 2) +
                     " (one angle a rotation pair of each head)",
                 shape_text(*cos));
    }
  } else if (cos && cos->size(-1) != q.size(2)) {
    fail_value(op, "cos",
               "a last dimension of q's width " + std::to_string(q.size(2)) +
                   " (the rotation spans the row)",
               shape_text(*cos));
  }
  if (cos) {
    // The table's positions, batch, dtype and device, checked under this op's name.
    rope_shape(op, q, k, *cos, *sin, true, head_dim, "bshd", head_dim == -1 ? q.size(2) : head_dim,
               "q", "k");
  }
}

TensorPair rms_norm_rope_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                             const at::Tensor& k_weight, double eps,
                             const std::optional<at::Tensor>& cos,
                             const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                             std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                             at::IntArrayRef patch_sizes, double theta, std::int64_t head_dim) {
  check_rms_norm_rope(q, k, q_weight, k_weight, cos, sin, grid, scale, base_sizes, patch_sizes,
                      head_dim);
  require_cpu("rms_norm_rope", q);
  const auto norm = [&](const at::Tensor& x, const at::Tensor& w) {
    const at::Tensor xf = x.to(at::kFloat);
    return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps) * w.to(at::kFloat)).to(x.scalar_type());
  };
  at::Tensor c, s;
  if (grid) {
    std::tie(c, s) = video_table(q.size(2), to_vector(*grid), to_vector(scale),
                                 to_vector(base_sizes), to_vector(patch_sizes), theta, q.device());
  } else {
    c = *cos;
    s = *sin;
  }
  return rope_cpu(norm(q, q_weight), norm(k, k_weight), c, s, true, head_dim, "bshd", head_dim,
                  false);
}

}  // namespace kiln::torch_ops

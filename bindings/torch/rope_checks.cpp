// Argument checks and views shared by the CPU and CUDA implementations of the RoPE ops.
#include <ATen/ATen.h>

#include "bindings/torch/rope.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {

namespace {

void check_same_device(const std::string& op, const std::string& arg, const at::Tensor& t,
                       const at::Tensor& q, const std::string& q_arg) {
  if (t.device() != q.device()) {
    fail_value(op, arg, "device " + q.device().str() + " (as " + q_arg + ")", t.device().str());
  }
}

// cos or sin (of 2 to 4 dimensions, a heads axis of 1: rope_shape checked) as [B or 1, S, R],
// before broadcasting.
at::Tensor table_view(const at::Tensor& t, bool bhsd) {
  if (t.dim() == 2) {
    return t.unsqueeze(0);
  }
  return t.dim() == 4 ? t.squeeze(bhsd ? 1 : 2) : t;
}

// The table shapes a layout takes, as error messages name them (the heads axis where the
// layout has it).
std::string table_forms(const std::string& layout) {
  return layout == "bhsd" ? "[S, R], [B, S, R] or [B, 1, S, R]"
                          : "[S, R], [B, S, R] or [B, S, 1, R]";
}

}  // namespace

at::Tensor rope_view(const at::Tensor& x, const std::string& layout, std::int64_t head_dim) {
  if (layout == "bhsd") {
    return x.permute({0, 2, 1, 3});
  }
  if (x.dim() == 4) {
    return x;
  }
  at::Tensor source = x.stride(-1) == 1 ? x : x.contiguous();
  return source.unflatten(-1, {x.size(-1) / head_dim, head_dim});
}

at::Tensor rope_output(const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  if (out.stride(-1) == 1) {
    return out;
  }
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

RopeShape rope_shape(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                     std::int64_t rotary_dim, const std::string& layout, std::int64_t head_dim,
                     const std::string& q_arg, const std::string& k_arg) {
  RopeShape shape;
  shape.dtype = kernel_or_reference_dtype(op, q_arg, q);
  if (k.scalar_type() != q.scalar_type()) {
    fail_type(op, k_arg, "dtype " + dtype_text(q.scalar_type()) + " (as " + q_arg + ")",
              dtype_text(k.scalar_type()));
  }
  check_same_device(op, k_arg, k, q, q_arg);
  check_same_device(op, "cos", cos, q, q_arg);
  check_same_device(op, "sin", sin, q, q_arg);
  for (const auto& [arg, table] : {std::pair{"cos", &cos}, std::pair{"sin", &sin}}) {
    if (table->scalar_type() != at::kFloat && table->scalar_type() != q.scalar_type()) {
      fail_type(op, arg,
                q.scalar_type() == at::kFloat
                    ? "dtype float32 (as " + q_arg + ")"
                    : "dtype float32 or " + dtype_text(q.scalar_type()) + " (as " + q_arg + ")",
                dtype_text(table->scalar_type()));
    }
  }
  if (sin.scalar_type() != cos.scalar_type()) {
    fail_type(op, "sin", "dtype " + dtype_text(cos.scalar_type()) + " (as cos)",
              dtype_text(sin.scalar_type()));
  }
  if (sin.sizes() != cos.sizes()) {
    fail_value(op, "sin", "shape " + shape_text(cos) + " (as cos)", shape_text(sin));
  }
  if (layout != "bhsd" && layout != "bshd") {
    fail_value(op, "layout", "\"bhsd\" ([B, H, S, D]) or \"bshd\" ([B, S, H, D] or [B, S, H*D])",
               "\"" + layout + "\"");
  }
  shape.bhsd = layout == "bhsd";
  shape.flat = layout == "bshd" && q.dim() == 3;
  for (const auto& [arg, t] : {std::pair{q_arg, &q}, std::pair{k_arg, &k}}) {
    if (shape.flat ? t->dim() != 3 : t->dim() != 4) {
      fail_value(op, arg,
                 layout == "bhsd" ? "4 dimensions [B, H, S, D]"
                 : shape.flat     ? "3 dimensions [B, S, H*D] (as " + q_arg + ")"
                                  : "4 dimensions [B, S, H, D] or 3 [B, S, H*D]",
                 shape_text(*t));
    }
  }
  if (cos.dim() < 2) {
    fail_value(op, "cos", table_forms(layout), shape_text(cos));
  }
  const std::int64_t table_width = cos.size(-1);
  if (shape.flat) {
    if (head_dim == -1) {
      head_dim = table_width;
    }
    if (head_dim <= 0 || q.size(-1) % head_dim != 0 || k.size(-1) % head_dim != 0) {
      fail_value(op, "head_dim",
                 "a divisor of " + q_arg + "'s and " + k_arg + "'s last dimensions (" +
                     std::to_string(q.size(-1)) + ", " + std::to_string(k.size(-1)) + ")",
                 std::to_string(head_dim));
    }
    shape.head_dim = head_dim;
  }
  // [B, S, H, D] of q and of k in this layout.
  const auto dims = [&](const at::Tensor& t) {
    if (shape.bhsd) {
      return std::array<std::int64_t, 4>{t.size(0), t.size(2), t.size(1), t.size(3)};
    }
    if (!shape.flat) {
      return std::array<std::int64_t, 4>{t.size(0), t.size(1), t.size(2), t.size(3)};
    }
    return std::array<std::int64_t, 4>{t.size(0), t.size(1), t.size(2) / head_dim, head_dim};
  };
  const auto qd = dims(q);
  const auto kd = dims(k);
  const std::int64_t d = qd[3];
  if (d % 2 != 0) {
    fail_value(op, q_arg, "an even head dim", std::to_string(d) + " in " + shape_text(q));
  }
  if (kd[0] != qd[0] || kd[1] != qd[1] || kd[3] != d) {
    fail_value(op, k_arg, q_arg + "'s batch, sequence length and head dim in layout " + layout,
               shape_text(k) + " (" + q_arg + " is " + shape_text(q) + ")");
  }
  shape.batch = qd[0];
  shape.seq = qd[1];
  shape.heads_q = qd[2];
  shape.heads_k = kd[2];
  shape.d = d;
  shape.rotary_dim = rotary_dim == -1 ? table_width : rotary_dim;
  if (shape.rotary_dim < 2 || shape.rotary_dim % 2 != 0 || shape.rotary_dim > d) {
    fail_value(op, rotary_dim == -1 ? "cos" : "rotary_dim",
               "an even rotated width in [2, head dim " + std::to_string(d) + "]",
               rotary_dim == -1 ? shape_text(cos) : std::to_string(rotary_dim));
  }
  // A table of rotary_dim / 2 angles gives each rotation pair its angle once.
  shape.half_table = table_width * 2 == shape.rotary_dim;
  if (shape.rotary_dim > table_width && !shape.half_table) {
    fail_value(op, "cos",
               "a last dimension >= rotary_dim " + std::to_string(shape.rotary_dim) + ", or " +
                   std::to_string(shape.rotary_dim / 2) + " (one angle a rotation pair)",
               shape_text(cos));
  }
  shape.angles = shape.half_table ? shape.rotary_dim / 2 : shape.rotary_dim;
  for (const auto& [arg, t] : {std::pair{"cos", &cos}, std::pair{"sin", &sin}}) {
    if (t->dim() > 4) {
      fail_value(op, arg, table_forms(layout) + " (2 to 4 dimensions)", shape_text(*t));
    }
    const std::int64_t heads_axis = shape.bhsd ? 1 : 2;
    if (t->dim() == 4 && t->size(heads_axis) != 1) {
      fail_value(op, arg,
                 "a heads axis (dimension " + std::to_string(heads_axis) +
                     ") of size 1 in layout " + layout,
                 shape_text(*t));
    }
    const std::int64_t rows = t->dim() == 2 ? 1 : t->size(0);
    const std::int64_t positions = t->dim() == 4 ? t->size(shape.bhsd ? 2 : 1) : t->size(-2);
    if ((rows != 1 && rows != shape.batch) || positions != shape.seq) {
      fail_value(op, arg,
                 "a table for " + std::to_string(shape.seq) + " positions (batch 1 or " +
                     std::to_string(shape.batch) + ")",
                 shape_text(*t));
    }
  }
  shape.interleaved = interleaved;
  return shape;
}

void check_deinterleave(const std::string& op, bool interleaved, bool deinterleave) {
  if (deinterleave && interleaved) {
    fail_value(op, "deinterleave",
               "false with interleaved=True (it de-interleaves pairs for a rotate_half rotation)",
               "true");
  }
}

RopeOperands rope_operands(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                           std::int64_t rotary_dim, const std::string& layout,
                           std::int64_t head_dim, const std::string& q_arg,
                           const std::string& k_arg) {
  const RopeShape shape =
      rope_shape(op, q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, q_arg, k_arg);
  RopeOperands r;
  r.dtype = shape.dtype;
  r.q4 = rope_view(q, layout, shape.d);
  r.k4 = rope_view(k, layout, shape.d);
  r.rotary_dim = shape.rotary_dim;
  r.half_table = shape.half_table;
  for (const auto& [t, out] : {std::pair{&cos, &r.cos3}, std::pair{&sin, &r.sin3}}) {
    at::Tensor view = table_view(*t, shape.bhsd);
    if (view.stride(-1) != 1) {
      view = view.contiguous();
    }
    *out = view.narrow(-1, 0, shape.angles).expand({shape.batch, shape.seq, shape.angles});
  }
  r.interleaved = interleaved;
  return r;
}

}  // namespace kiln::torch_ops

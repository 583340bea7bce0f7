// The CUDA implementations: validate, describe the problem, ask the runtime for the kernel,
// fill its parameters from the tensors' strides and launch on the current stream.
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <limits>

#include "bindings/torch/launch_op.h"
#include "bindings/torch/rope.h"
#include "bindings/torch/tensor_checks.h"
#include "cache/error.h"
#include "templates/kiln/rope_params.cuh"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"
#include "templates/rope_video.h"

namespace kiln::torch_ops {

namespace {

void require_cuda(const std::string& op, const at::Tensor& q, const std::string& arg = "q") {
  if (!q.is_cuda()) {
    fail_value(op, arg, "a CUDA tensor", q.device().str());
  }
}

VideoRopeSettings video_settings(const VideoArgs& v) {
  VideoRopeSettings s;
  s.frames = static_cast<int>(v.grid[0]);
  s.height = static_cast<int>(v.grid[1]);
  s.width = static_cast<int>(v.grid[2]);
  if (v.scale) {
    s.interpolation_scale = std::array<double, 3>{(*v.scale)[0], (*v.scale)[1], (*v.scale)[2]};
  } else {
    s.interpolation_scale.reset();
  }
  for (int a = 0; a < 3; ++a) {
    s.base_sizes[a] = static_cast<int>(v.base_sizes[a]);
  }
  s.patch_size_t = static_cast<int>(v.patch_sizes[0]);
  s.patch_size = static_cast<int>(v.patch_sizes[1]);
  s.theta = v.theta;
  return s;
}

VideoArgs video_args(at::IntArrayRef grid, std::optional<at::ArrayRef<double>> scale,
                     at::IntArrayRef base_sizes, at::IntArrayRef patch_sizes, double theta) {
  VideoArgs v;
  v.grid.assign(grid.begin(), grid.end());
  if (scale) {
    v.scale = std::vector<double>(scale->begin(), scale->end());
  }
  v.base_sizes.assign(base_sizes.begin(), base_sizes.end());
  v.patch_sizes.assign(patch_sizes.begin(), patch_sizes.end());
  v.theta = theta;
  return v;
}

std::uintptr_t address(const at::Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr());
}

// Alignment of every address and every (non-zero) stride in bytes of the given views.
std::uint32_t alignment_of(std::initializer_list<const at::Tensor*> tensors) {
  std::uintptr_t bits = 16;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) {
      continue;
    }
    bits |= address(*t);
    for (std::int64_t d = 0; d + 1 < t->dim(); ++d) {
      bits |= static_cast<std::uintptr_t>(t->stride(d) * t->element_size());
    }
  }
  return common_alignment({bits});
}

void fill_strides(long long* to, const at::Tensor& view, int count) {
  for (int i = 0; i < count; ++i) {
    to[i] = view.stride(i);
  }
}

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

// Interleaved rotations (and the 3-D and fused ones, which are interleaved) load each
// (real, imaginary) pair as one vector, so every operand must be aligned to a pair. A view
// that is not (a slice starting at an odd element, say) is read from an aligned copy, and a
// misaligned output is written through an aligned buffer: slower, but any view works.
std::uint32_t pair_bytes(const at::Tensor& t, bool interleaved) {
  return static_cast<std::uint32_t>(t.element_size()) * (interleaved ? 2u : 1u);
}

at::Tensor pair_aligned(const at::Tensor& t, std::uint32_t pair) {
  if (!t.defined() || alignment_of({&t}) >= pair) {
    return t;
  }
  return t.clone(at::MemoryFormat::Contiguous);
}

at::Tensor pair_aligned_output(const at::Tensor& out, std::uint32_t pair) {
  if (alignment_of({&out}) >= pair) {
    return out;
  }
  return at::empty(out.sizes(), out.options().memory_format(at::MemoryFormat::Contiguous));
}

// q, k or an output as [B, S, H, D] element strides (batch, position, head, element) in the
// layout, from its own strides.
std::array<std::int64_t, 4> bshd_strides(const at::Tensor& x, const RopeShape& shape) {
  if (shape.bhsd) {
    return {x.stride(0), x.stride(2), x.stride(1), x.stride(3)};
  }
  if (!shape.flat) {
    return {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  }
  return {x.stride(0), x.stride(1), shape.head_dim * x.stride(2), x.stride(2)};
}

// cos or sin as [B, S, R] element strides (a batch of 1 broadcast with stride 0).
std::array<std::int64_t, 3> table_strides(const at::Tensor& t, const RopeShape& shape) {
  if (t.dim() == 2) {
    return {0, t.stride(0), t.stride(1)};
  }
  const int position = t.dim() == 4 && shape.bhsd ? 2 : 1;
  return {t.size(0) == 1 ? 0 : t.stride(0), t.stride(position), t.stride(-1)};
}

// kiln::rope's parameters for q, k, their outputs and the table (undefined with video angles)
// as `shape` describes them: the call's own tensors, or [B, S, H, D] views of aligned copies.
// Null where an operand would need a copy first (a strided last dimension, weights that are
// not contiguous, a misaligned interleaved pair).
struct Launch {
  Problem problem;
  RopeParams params{};
  std::int64_t rows = 0;
};

std::optional<Launch> plan(const RopeShape& shape, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q_out,
                           const at::Tensor& k_out, bool inverse, bool video,
                           const HeadNormArgs* head_norm) {
  const std::array<std::int64_t, 4> geometry[] = {bshd_strides(q, shape), bshd_strides(k, shape),
                                                  bshd_strides(q_out, shape),
                                                  bshd_strides(k_out, shape)};
  const void* addresses[] = {q.data_ptr(), k.data_ptr(), q_out.data_ptr(), k_out.data_ptr()};
  const auto element = static_cast<std::int64_t>(q.element_size());
  std::uintptr_t bits = 0;
  bool unit_last = true;
  for (int t = 0; t < 4; ++t) {
    // A k of no heads (q rotated alone) is never read or written: its strides (a zero-filled
    // gradient's rows are 1 element apart) say nothing of the launch's alignment.
    if (t % 2 == 1 && shape.heads_k == 0) {
      continue;
    }
    bits |= reinterpret_cast<std::uintptr_t>(addresses[t]);
    for (int i = 0; i < 3; ++i) {
      bits |= static_cast<std::uintptr_t>(geometry[t][i] * element);
    }
    unit_last = unit_last && geometry[t][3] == 1;
  }
  std::array<std::int64_t, 3> tables[2] = {};
  if (!video) {
    tables[0] = table_strides(cos, shape);
    tables[1] = table_strides(sin, shape);
    bits |= address(cos) | address(sin);
    for (const auto& strides : tables) {
      for (int i = 0; i < 2; ++i) {
        bits |= static_cast<std::uintptr_t>(strides[i] * std::int64_t(cos.element_size()));
      }
      unit_last = unit_last && strides[2] == 1;
    }
  }
  if (head_norm != nullptr) {
    for (const at::Tensor* weight : {&head_norm->q_weight, &head_norm->k_weight}) {
      if (weight->defined()) {
        unit_last = unit_last && weight->is_contiguous();
        bits |= address(*weight);
      }
    }
  }
  if (!unit_last || common_alignment({bits}) < pair_bytes(q, shape.interleaved)) {
    return std::nullopt;
  }

  Launch launch;
  launch.rows = shape.batch * shape.seq * (shape.heads_q + shape.heads_k);
  Problem& problem = launch.problem;
  problem.op = video ? Op::rope_3d : Op::rope;
  problem.dtype = shape.dtype;
  problem.hidden = shape.d;
  problem.aux = shape.rotary_dim == shape.d ? 0 : shape.rotary_dim;
  // [B, H, S, D] data (a head's positions nearer than a position's heads) is walked
  // positions-inner, so neighbouring threads read neighbouring memory.
  const bool positions_inner = !video && geometry[0][1] < geometry[0][2];
  if (!video) {
    problem.flags =
        (shape.interleaved ? kRopeInterleaved : 0u) |
        (cos.scalar_type() == at::kFloat ? kRopeTableF32 : 0u) | (inverse ? kRopeInverse : 0u) |
        (positions_inner ? kRopePositionsInner : 0u) | (shape.half_table ? kRopeHalfTable : 0u) |
        rope_head_flags(shape.heads_q, shape.heads_k) |
        (head_norm != nullptr ? kRopeHeadNorm : 0u) | (shape.deinterleave ? kRopeDeinterleave : 0u);
  }
  problem.align = common_alignment({bits});

  RopeParams& p = launch.params;
  p.q = addresses[0];
  p.k = addresses[1];
  p.q_out = const_cast<void*>(addresses[2]);
  p.k_out = const_cast<void*>(addresses[3]);
  set_row_order(p, launch.rows, static_cast<int>(shape.batch), static_cast<int>(shape.heads_q),
                static_cast<int>(shape.heads_k), positions_inner, shape.d * element);
  long long* strides[] = {p.q_strides, p.k_strides, p.q_out_strides, p.k_out_strides};
  for (int t = 0; t < 4; ++t) {
    std::copy_n(geometry[t].begin(), 3, strides[t]);
  }
  if (!video) {
    p.cos = cos.data_ptr();
    p.sin = sin.data_ptr();
    std::copy_n(tables[0].begin(), 2, p.cos_strides);
    std::copy_n(tables[1].begin(), 2, p.sin_strides);
  }
  if (head_norm != nullptr) {
    const at::Tensor& qw = head_norm->q_weight;
    const at::Tensor& kw = head_norm->k_weight;
    p.head_norm.q_weight = qw.defined() ? qw.data_ptr() : nullptr;
    p.head_norm.k_weight = kw.defined() ? kw.data_ptr() : nullptr;
    p.head_norm.eps = static_cast<float>(head_norm->eps);
  }
  return launch;
}

void run(const std::string& op, Launch& launch, const at::Tensor& like,
         const std::optional<VideoArgs>& video) {
  if (launch.rows == 0) {
    return;
  }
  if (launch.rows > std::numeric_limits<std::int32_t>::max()) {
    fail_value(op, "q", "fewer than 2^31 (batch x sequence x heads) rows of q and k together",
               std::to_string(launch.rows));
  }
  if (video) {
    try {
      launch.params.video =
          make_video_grid(op.c_str(), launch.problem.hidden, video_settings(*video));
    } catch (const ArgumentError& error) {
      TORCH_CHECK_VALUE(false, error.what());
    }
  }
  launch_op(like, launch.problem, launch.rows, &launch.params);
}

}  // namespace

void rope_launch(const std::string& op, const RopeOperands& r, const at::Tensor& q_out4,
                 const at::Tensor& k_out4, const std::optional<VideoArgs>& video,
                 const HeadNormArgs* head_norm) {
  const std::uint32_t pair = pair_bytes(r.q4, r.interleaved);
  const at::Tensor q4 = pair_aligned(last_dim_contiguous(r.q4), pair);
  const at::Tensor k4 = pair_aligned(last_dim_contiguous(r.k4), pair);
  const at::Tensor cos3 = pair_aligned(r.cos3, pair);
  const at::Tensor sin3 = pair_aligned(r.sin3, pair);
  const at::Tensor q_dst = pair_aligned_output(q_out4, pair);
  const at::Tensor k_dst = pair_aligned_output(k_out4, pair);
  std::optional<HeadNormArgs> norm;
  if (head_norm != nullptr) {
    norm = *head_norm;
    for (at::Tensor* weight : {&norm->q_weight, &norm->k_weight}) {
      if (weight->defined()) {
        *weight = pair_aligned(weight->contiguous(), pair);
      }
    }
  }
  // The aligned views are [B, S, H, D] and [B, S, R]: the layout "bshd" names.
  RopeShape shape;
  shape.bhsd = false;
  shape.batch = q4.size(0);
  shape.seq = q4.size(1);
  shape.heads_q = q4.size(2);
  shape.heads_k = k4.size(2);
  shape.d = q4.size(3);
  shape.rotary_dim = r.rotary_dim;
  shape.half_table = r.half_table;
  shape.interleaved = r.interleaved;
  shape.deinterleave = r.deinterleave;
  shape.dtype = r.dtype;
  std::optional<Launch> launch = plan(shape, q4, k4, cos3, sin3, q_dst, k_dst, r.inverse,
                                      video.has_value(), norm ? &*norm : nullptr);
  TORCH_INTERNAL_ASSERT(launch, "kiln.", op, ": aligned operands were refused");
  run(op, *launch, q4, video);
  if (!q_dst.is_same(q_out4)) {
    q_out4.copy_(q_dst);
  }
  if (!k_dst.is_same(k_out4)) {
    k_out4.copy_(k_dst);
  }
}

void rope_launch_table(const std::string& op, const RopeShape& shape, const at::Tensor& q,
                       const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                       const std::string& layout, const at::Tensor& q_out, const at::Tensor& k_out,
                       bool inverse, const HeadNormArgs* head_norm) {
  std::optional<Launch> launch =
      plan(shape, q, k, cos, sin, q_out, k_out, inverse, /*video=*/false, head_norm);
  if (launch) {
    run(op, *launch, q, std::nullopt);
    return;
  }
  // A copy is needed somewhere: the views' path makes it.
  RopeOperands r = rope_operands(op, q, k, cos, sin, shape.interleaved, shape.rotary_dim, layout,
                                 shape.flat ? shape.head_dim : -1);
  r.inverse = inverse;
  r.deinterleave = shape.deinterleave;
  rope_launch(op, r, rope_view(q_out, layout, shape.d), rope_view(k_out, layout, shape.d),
              std::nullopt, head_norm);
}

TensorPair rope_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                     const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                     std::string_view layout, std::int64_t head_dim, bool deinterleave) {
  const std::string lay(layout);
  RopeShape shape = rope_shape("rope", q, k, cos, sin, interleaved, rotary_dim, lay, head_dim);
  check_deinterleave("rope", interleaved, deinterleave);
  shape.deinterleave = deinterleave;
  require_cuda("rope", q);
  // Laid out as q and k are (rope_output): transformers' q is [B, S, H, D] in memory.
  at::Tensor q_out = rope_output(q);
  at::Tensor k_out = rope_output(k);
  rope_launch_table("rope", shape, q, k, cos, sin, lay, q_out, k_out, /*inverse=*/false);
  return {q_out, k_out};
}

TensorPair rope_backward_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k,
                              const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                              std::int64_t rotary_dim, std::string_view layout,
                              std::int64_t head_dim, bool deinterleave) {
  const std::string lay(layout);
  RopeShape shape = rope_shape("rope_backward", grad_q, grad_k, cos, sin, interleaved, rotary_dim,
                               lay, head_dim, "grad_q", "grad_k");
  check_deinterleave("rope_backward", interleaved, deinterleave);
  shape.deinterleave = deinterleave;
  require_cuda("rope_backward", grad_q, "grad_q");
  at::Tensor dq = rope_output(grad_q);
  at::Tensor dk = rope_output(grad_k);
  rope_launch_table("rope_backward", shape, grad_q, grad_k, cos, sin, lay, dq, dk,
                    /*inverse=*/true);
  return {dq, dk};
}

void rope_inplace_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                       std::string_view layout, std::int64_t head_dim, bool deinterleave) {
  const std::string lay(layout);
  const RopeShape shape =
      rope_shape("rope_", q, k, cos, sin, interleaved, rotary_dim, lay, head_dim);
  check_deinterleave("rope_", interleaved, deinterleave);
  require_cuda("rope_", q);
  // Rows not addressable in place (a strided last dimension), or moved across threads
  // (de-interleaved): rotate a copy, copy back.
  if (q.stride(-1) != 1 || k.stride(-1) != 1 || deinterleave) {
    auto [q_out, k_out] =
        rope_cuda(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave);
    q.copy_(q_out);
    k.copy_(k_out);
    return;
  }
  // q and k are their own outputs: the kernel leaves the unrotated columns alone.
  rope_launch_table("rope_", shape, q, k, cos, sin, lay, q, k, /*inverse=*/false);
}

TensorPair rope_3d_cuda(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                        std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                        at::IntArrayRef patch_sizes, double theta) {
  check_rope_3d(q, k, grid, scale, base_sizes, patch_sizes);
  require_cuda("rope_3d", q);
  RopeOperands r;
  r.dtype = kiln_dtype("rope_3d", "q", q);
  r.q4 = q.unsqueeze(2);
  r.k4 = k.unsqueeze(2);
  r.rotary_dim = q.size(2);
  r.interleaved = true;
  at::Tensor q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor k_out = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
  rope_launch("rope_3d", r, q_out.unsqueeze(2), k_out.unsqueeze(2),
              video_args(grid, scale, base_sizes, patch_sizes, theta));
  return {q_out, k_out};
}

TensorPair rms_norm_rope_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                              const at::Tensor& k_weight, double eps,
                              const std::optional<at::Tensor>& cos,
                              const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                              std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                              at::IntArrayRef patch_sizes, double theta, std::int64_t head_dim) {
  const std::string op = "rms_norm_rope";
  check_rms_norm_rope(q, k, q_weight, k_weight, cos, sin, grid, scale, base_sizes, patch_sizes,
                      head_dim);
  require_cuda(op, q);
  const std::uint32_t pair = pair_bytes(q, /*interleaved=*/true);
  const at::Tensor qc = pair_aligned(last_dim_contiguous(q), pair);
  const at::Tensor kc = pair_aligned(last_dim_contiguous(k), pair);
  const at::Tensor qw = pair_aligned(q_weight.contiguous(), pair);
  const at::Tensor kw = pair_aligned(k_weight.contiguous(), pair);
  at::Tensor q_out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor k_out = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
  const std::int64_t batch = q.size(0), seq = q.size(1), width = q.size(2);
  const std::int64_t rows = batch * seq;
  if (rows == 0) {
    return {q_out, k_out};
  }
  if (rows > std::numeric_limits<std::int32_t>::max()) {
    fail_value(op, "q", "fewer than 2^31 (batch x sequence) tokens", std::to_string(rows));
  }

  Problem problem;
  problem.op = Op::rms_norm_rope;
  problem.dtype = kiln_dtype(op, "q", q);
  problem.hidden = width;
  RmsNormRopeParams p{};
  at::Tensor cos3, sin3;
  if (grid) {
    problem.flags = kRmsNormRopeVideo;
    try {
      p.video =
          make_video_grid(op.c_str(), width,
                          video_settings(video_args(*grid, scale, base_sizes, patch_sizes, theta)));
    } catch (const ArgumentError& error) {
      TORCH_CHECK_VALUE(false, error.what());
    }
  } else {
    // A table of each head's pairs ([.., S, head_dim / 2]) or of the whole row.
    const RopeOperands r =
        head_dim == -1 ? rope_operands(op, q, k, *cos, *sin, true, -1, "bshd", width)
                       : rope_operands(op, q, k, *cos, *sin, true, head_dim, "bshd", head_dim);
    problem.aux = head_dim == -1 ? 0 : head_dim;
    cos3 = pair_aligned(r.cos3, pair);
    sin3 = pair_aligned(r.sin3, pair);
    problem.flags = cos3.scalar_type() == at::kFloat ? kRmsNormRopeTableF32 : 0u;
    p.cos = cos3.data_ptr();
    p.sin = sin3.data_ptr();
    fill_strides(p.cos_strides, cos3, 2);
    fill_strides(p.sin_strides, sin3, 2);
  }
  problem.align = alignment_of({&qc, &kc, &qw, &kw, &q_out, &k_out, &cos3, &sin3});

  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.q_weight = qw.data_ptr();
  p.k_weight = kw.data_ptr();
  p.q_out = q_out.data_ptr();
  p.k_out = k_out.data_ptr();
  p.rows = rows;
  set_seq_len(p, seq);
  fill_strides(p.q_strides, qc, 2);
  fill_strides(p.k_strides, kc, 2);
  fill_strides(p.q_out_strides, q_out, 2);
  fill_strides(p.k_out_strides, k_out, 2);
  p.eps = static_cast<float>(eps);
  launch_op(q, problem, rows, &p);
  return {q_out, k_out};
}

}  // namespace kiln::torch_ops

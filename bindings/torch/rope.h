// kiln's RoPE ops: rope / rope_ (table), rope_3d (LTX-Video angles from coordinates) and
// rms_norm_rope (LTX-Video's q/k RMSNorm across heads + interleaved RoPE), head_norm_rope
// (an RMSNorm of each head, as Qwen3, Gemma 3 and FLUX norm q and k, + RoPE).
//
// Layouts. "bhsd": q [B, Hq, S, D] and k [B, Hk, S, D] (transformers). "bshd": q
// [B, S, Hq, D] or, before the head split, [B, S, Hq * D] (diffusers); the head dim of a
// 3-D input is `head_dim`, or cos's last dimension when head_dim is -1 (diffusers' LTX-Video
// table spans the whole row: one "head" of H * D). cos/sin: [S, R], [B or 1, S, R], or 4-D
// with a heads axis of 1 where the layout has its heads; fp32 or q's dtype. R is the
// rotated width: rotary_dim (-1: R), the first rotary_dim columns of each head rotate with
// cos[..., :rotary_dim], the rest pass through. A table whose last dimension is rotary_dim / 2
// gives each rotation pair one angle (GPT-OSS's tables): the pair (i, i + R/2), or (2j, 2j + 1)
// interleaved, turns by the angle of column i (j).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "templates/types.h"

namespace kiln::torch_ops {

// q or k seen as [B, S, H, D] (a view, any strides, last dimension contiguous).
struct RopeOperands {
  at::Tensor q4, k4;  // inputs
  // [B, S, R] views (stride 0 where broadcast), [B, S, R / 2] for a half table; undefined
  // for video
  at::Tensor cos3, sin3;
  std::int64_t rotary_dim = 0;
  bool half_table = false;  // one angle a rotation pair (cos's last dimension R / 2)
  bool interleaved = false;
  bool deinterleave = false;  // the rows' pairs de-interleaved first (check_deinterleave)
  bool inverse = false;       // the transposed rotation (rope_backward)
  DType dtype = DType::f32;
};

// A checked call's sizes, read from its tensors' shapes without making a view.
struct RopeShape {
  std::int64_t batch = 0, seq = 0, heads_q = 0, heads_k = 0, d = 0;
  std::int64_t rotary_dim = 0;
  std::int64_t angles = 0;    // a table row's angles used: rotary_dim, or half of it
  std::int64_t head_dim = 0;  // a flat [B, S, H*D] layout's D (0 otherwise)
  bool bhsd = true;           // the layout: "bhsd", or "bshd" (4-D, or flat 3-D)
  bool flat = false;
  bool half_table = false;
  bool interleaved = false;
  bool deinterleave = false;
  DType dtype = DType::f32;
};

// Every check of rope's arguments (q_arg and k_arg: what error messages call q and k,
// rope_backward's grad_q, grad_k; float64 passes on the CPU, see kernel_or_reference_dtype).
RopeShape rope_shape(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                     std::int64_t rotary_dim, const std::string& layout, std::int64_t head_dim,
                     const std::string& q_arg = "q", const std::string& k_arg = "k");
// rope's `deinterleave` (DeepSeek-V3's MLA RoPE with rope_interleave): the first rotary_dim
// columns of each head are taken as pairs (2j, 2j + 1) and rotated as rotate_half rotates
// (j, j + R/2), where the output holds them. Fails unless it comes with the half-split rotation
// (interleaved false).
void check_deinterleave(const std::string& op, bool interleaved, bool deinterleave);
// rope_shape's checks, and the views the references and the general launch path read.
RopeOperands rope_operands(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                           std::int64_t rotary_dim, const std::string& layout,
                           std::int64_t head_dim, const std::string& q_arg = "q",
                           const std::string& k_arg = "k");
// The [B, S, H, D] view of a tensor of q's (or k's) shape in `layout`.
at::Tensor rope_view(const at::Tensor& x, const std::string& layout, std::int64_t head_dim);

// A new tensor of x's shape laid out as x is (torch's empty_like, as its elementwise ops
// lay out their results), or contiguous where that layout would not have a unit last stride:
// kernels write rows of contiguous elements. transformers' q and k are [B, S, H, D] in
// memory, viewed as [B, H, S, D]: their rotations and their gradients keep that layout, so
// the projections' backward can reshape the gradients without a copy. The fakes allocate the
// same.
at::Tensor rope_output(const at::Tensor& x);

// Reference math in fp32 (float64 for float64 x) on [B, S, H, D] views, written into out4
// (which may alias x4). `inverse`: the transposed map, x * cos - J(x * sin), RoPE's backward.
// cos3/sin3 of rotary_dim / 2 columns are a half table (each pair's angle once).
void rope_reference(const at::Tensor& x4, const at::Tensor& cos3, const at::Tensor& sin3,
                    std::int64_t rotary_dim, bool interleaved, const at::Tensor& out4,
                    bool inverse = false, bool deinterleave = false);
// diffusers' LTXVideoRotaryPosEmbed table, [1, S, dim] fp32 each (cos, sin), on `device`.
std::pair<at::Tensor, at::Tensor> video_table(std::int64_t dim,
                                              const std::vector<std::int64_t>& grid,
                                              const std::optional<std::vector<double>>& scale,
                                              const std::vector<std::int64_t>& base_sizes,
                                              const std::vector<std::int64_t>& patch_sizes,
                                              double theta, const c10::Device& device);

// Launches kiln::rope on CUDA (table or video angles) for the views.
struct VideoArgs {
  std::vector<std::int64_t> grid;
  std::optional<std::vector<double>> scale;
  std::vector<std::int64_t> base_sizes;
  std::vector<std::int64_t> patch_sizes;
  double theta = 10000.0;
};
// head_norm_rope's norm of each head before its rotation: weights of the head dim and q's
// dtype (undefined: none) and epsilon.
struct HeadNormArgs {
  at::Tensor q_weight;
  at::Tensor k_weight;
  double eps = 1e-6;
};
void rope_launch(const std::string& op, const RopeOperands& operands, const at::Tensor& q_out4,
                 const at::Tensor& k_out4, const std::optional<VideoArgs>& video,
                 const HeadNormArgs* head_norm = nullptr);
// rope's table rotation (or its inverse, or head_norm_rope's) of q and k into q_out and k_out
// (tensors of q's and k's shapes in `layout`, or q and k themselves), read from their sizes
// and strides without a view: a view costs a dispatcher call, and the views of the general
// path cost a decode-sized call more host time than its launch. Falls back to that path where
// an operand needs a copy (a strided last dimension, a misaligned interleaved pair).
void rope_launch_table(const std::string& op, const RopeShape& shape, const at::Tensor& q,
                       const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                       const std::string& layout, const at::Tensor& q_out, const at::Tensor& k_out,
                       bool inverse, const HeadNormArgs* head_norm = nullptr);

void check_rope_3d(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                   std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                   at::IntArrayRef patch_sizes);
void check_rms_norm_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                         const at::Tensor& k_weight, const std::optional<at::Tensor>& cos,
                         const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                         std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                         at::IntArrayRef patch_sizes, std::int64_t head_dim);

using TensorPair = std::tuple<at::Tensor, at::Tensor>;

TensorPair rope_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                    std::string_view layout, std::int64_t head_dim, bool deinterleave);
TensorPair rope_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                     const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                     std::string_view layout, std::int64_t head_dim, bool deinterleave);
// RoPE's backward: grad_q, grad_k -> the gradients of q and k (the transposed rotation, with
// rope's options; cos and sin get no gradient). New contiguous tensors of the grads' shapes.
TensorPair rope_backward_cpu(const at::Tensor& grad_q, const at::Tensor& grad_k,
                             const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                             std::int64_t rotary_dim, std::string_view layout,
                             std::int64_t head_dim, bool deinterleave);
TensorPair rope_backward_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k,
                              const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                              std::int64_t rotary_dim, std::string_view layout,
                              std::int64_t head_dim, bool deinterleave);
void rope_inplace_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                      const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                      std::string_view layout, std::int64_t head_dim, bool deinterleave);
void rope_inplace_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, bool interleaved, std::int64_t rotary_dim,
                       std::string_view layout, std::int64_t head_dim, bool deinterleave);

// head_norm_rope: each head of q and k RMS-normalised over the head dim D (x * rsqrt(mean(x^2)
// + eps) * weight, q_weight / k_weight [D] of q's dtype or none), rounded to q's dtype as a
// separate norm's output is, then rotated as rope rotates (same options); the in-place form
// overwrites q and k. Outputs laid out as rope's.
TensorPair head_norm_rope_cpu(const at::Tensor& q, const at::Tensor& k,
                              const std::optional<at::Tensor>& q_weight,
                              const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                              const at::Tensor& sin, double eps, bool interleaved,
                              std::int64_t rotary_dim, std::string_view layout,
                              std::int64_t head_dim);
TensorPair head_norm_rope_cuda(const at::Tensor& q, const at::Tensor& k,
                               const std::optional<at::Tensor>& q_weight,
                               const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                               const at::Tensor& sin, double eps, bool interleaved,
                               std::int64_t rotary_dim, std::string_view layout,
                               std::int64_t head_dim);
void head_norm_rope_inplace_cpu(const at::Tensor& q, const at::Tensor& k,
                                const std::optional<at::Tensor>& q_weight,
                                const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                                const at::Tensor& sin, double eps, bool interleaved,
                                std::int64_t rotary_dim, std::string_view layout,
                                std::int64_t head_dim);
void head_norm_rope_inplace_cuda(const at::Tensor& q, const at::Tensor& k,
                                 const std::optional<at::Tensor>& q_weight,
                                 const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                                 const at::Tensor& sin, double eps, bool interleaved,
                                 std::int64_t rotary_dim, std::string_view layout,
                                 std::int64_t head_dim);

TensorPair rope_3d_cpu(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                       std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                       at::IntArrayRef patch_sizes, double theta);
TensorPair rope_3d_cuda(const at::Tensor& q, const at::Tensor& k, at::IntArrayRef grid,
                        std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                        at::IntArrayRef patch_sizes, double theta);

TensorPair rms_norm_rope_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                             const at::Tensor& k_weight, double eps,
                             const std::optional<at::Tensor>& cos,
                             const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                             std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                             at::IntArrayRef patch_sizes, double theta, std::int64_t head_dim);
TensorPair rms_norm_rope_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                              const at::Tensor& k_weight, double eps,
                              const std::optional<at::Tensor>& cos,
                              const std::optional<at::Tensor>& sin, at::OptionalIntArrayRef grid,
                              std::optional<at::ArrayRef<double>> scale, at::IntArrayRef base_sizes,
                              at::IntArrayRef patch_sizes, double theta, std::int64_t head_dim);

}  // namespace kiln::torch_ops

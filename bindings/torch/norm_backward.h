// The backward ops of rms_norm, fused_add_rms_norm, layer_norm and adaln: what their
// autograd formulas (autograd_norm.cpp) call. Each recomputes the row
// statistics from the forward's input rather than taking them saved.
//
// Dtype rule: dy and every tensor given have x's dtype, and so does every gradient returned,
// rounded once from fp32 math (parameter gradients are summed over rows in fp32 first). On
// CPU, float64 is accepted too and computed in float64 (for gradcheck).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

#include "templates/types.h"

namespace kiln::torch_ops {

// ---- checks shared by the CPU and CUDA implementations (each returns x's dtype)

// `tensor` (named arg) has the shape, dtype and device of `like` (named like_name).
void check_same_as(const std::string& op, const std::string& arg, const at::Tensor& tensor,
                   const std::string& like_name, const at::Tensor& like);
// dy like x (shape, dtype, device); x (named x_name) with a hidden size; weight [D] if given.
DType check_norm_backward(const std::string& op, const at::Tensor& dy, const at::Tensor& x,
                          const std::string& x_name, const std::optional<at::Tensor>& weight);
// Whether an adaln operand ([B, 1, D] or [B, T, D]) has a row per token of x ([B, T, D]).
// With one token a sample, a per-sample operand is one too, and its gradient is the token's
// own: dscale written by the kernel in x's dtype, dshift dy itself. Taken per sample, the
// kernel would write fp32 partial rows for torch to sum and cast after it (a 1-row call:
// three launches instead of one).
inline bool per_token_operand(const at::Tensor& operand, const at::Tensor& x) {
  return operand.size(1) != 1 || x.size(1) == 1;
}

// x [B, T, D], dy like x, scale [B, 1 or T, D], weight and table_scale [D] if given.
DType check_adaln_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                           const std::optional<at::Tensor>& weight, const std::string& norm,
                           const std::optional<at::Tensor>& table_scale);

// ---- implementations: (dx, dweight) / (dx, dweight, dbias) / (dx, dscale, dshift, dweight,
// dtable_scale, dtable_shift).
//
// dx is always computed; every other gradient only where its `*_grad` argument asks for it
// (autograd passes which of the forward's inputs need one) and its parameter was given, else
// None. adaln: dscale is per token or per sample as scale is; dshift is None when shift is per
// token (its gradient is dy itself); dtable_scale / dtable_shift are dscale / dy summed over
// samples and tokens, the gradients of table rows added to scale and shift (past
// NormBackwardFamily::kMaxHiddenForTableSums wide with a per-token scale, dtable_scale sums
// dscale as rounded to the dtype, as eager autograd sums the rounded per-token gradient).

using GradPair = std::tuple<at::Tensor, std::optional<at::Tensor>>;
using GradTriple = std::tuple<at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>>;
using AdaLnGrads =
    std::tuple<at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
               std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>>;

GradPair rms_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, double eps,
                               bool weight_grad);
GradPair rms_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                const std::optional<at::Tensor>& weight, double eps,
                                bool weight_grad);

GradPair fused_add_rms_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& dr,
                                         const at::Tensor& r,
                                         const std::optional<at::Tensor>& weight, double eps,
                                         bool weight_grad);
GradPair fused_add_rms_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& dr,
                                          const at::Tensor& r,
                                          const std::optional<at::Tensor>& weight, double eps,
                                          bool weight_grad);

GradTriple layer_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& bias, double eps,
                                   bool weight_grad, bool bias_grad);
GradTriple layer_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                    const std::optional<at::Tensor>& weight,
                                    const std::optional<at::Tensor>& bias, double eps,
                                    bool weight_grad, bool bias_grad);

AdaLnGrads adaln_backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                              const std::optional<at::Tensor>& weight, double eps,
                              c10::string_view norm, const std::optional<at::Tensor>& table_scale,
                              bool shift_per_token, bool scale_grad, bool shift_grad,
                              bool weight_grad, bool table_scale_grad, bool table_shift_grad);
AdaLnGrads adaln_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                               const std::optional<at::Tensor>& weight, double eps,
                               c10::string_view norm, const std::optional<at::Tensor>& table_scale,
                               bool shift_per_token, bool scale_grad, bool shift_grad,
                               bool weight_grad, bool table_scale_grad, bool table_shift_grad);

}  // namespace kiln::torch_ops

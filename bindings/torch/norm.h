// The norm ops beyond rms_norm: fused_add_rms_norm (and its in-place form), layer_norm,
// adaln, gated_adaln and rms_norm_gated. Output dtype rule, for all of them: every tensor has x's
// dtype (checked), and every output has that dtype too, rounded once from fp32 math. That is what
// the modules they replace give when a model runs in one dtype (vLLM's fused_add_rms_norm,
// nn.LayerNorm / F.layer_norm, diffusers' RMSNorm and AdaLN blocks in bf16 or fp16).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

#include "templates/types.h"

namespace kiln::torch_ops {

// ---- checks shared by the CPU and CUDA implementations (each returns x's dtype)

DType check_fused_add_rms_norm(const std::string& op, const at::Tensor& x,
                               const at::Tensor& residual, const std::optional<at::Tensor>& weight);
DType check_layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias);
// rms_norm_gated: gate of x's shape, dtype and device; activation "silu" or "sigmoid" (whether
// it is the sigmoid is returned in `sigmoid`).
DType check_rms_norm_gated(const at::Tensor& x, const at::Tensor& gate,
                           const std::optional<at::Tensor>& weight, c10::string_view activation,
                           bool& sigmoid);

// The operands of adaln / gated_adaln, checked: x (or h) [B, T, D]; scale, shift (and gate)
// [B, 1, D] or [B, T, D]; table rows [D], all or none given.
struct AdaLnArgs {
  std::string op;
  const at::Tensor* x = nullptr;
  const at::Tensor* y = nullptr;     // gated_adaln only
  const at::Tensor* gate = nullptr;  // gated_adaln only
  const at::Tensor* scale = nullptr;
  const at::Tensor* shift = nullptr;
  const std::optional<at::Tensor>* weight = nullptr;
  const std::optional<at::Tensor>* table_gate = nullptr;  // gated_adaln only
  const std::optional<at::Tensor>* table_scale = nullptr;
  const std::optional<at::Tensor>* table_shift = nullptr;
  std::string norm;  // "rms" or "layer"
};
// The operands of an adaln / gated_adaln call, gathered (the tensors stay the caller's).
AdaLnArgs adaln_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                     const std::optional<at::Tensor>& weight, c10::string_view norm,
                     const std::optional<at::Tensor>& table_scale,
                     const std::optional<at::Tensor>& table_shift);
AdaLnArgs gated_adaln_args(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate,
                           const at::Tensor& scale, const at::Tensor& shift,
                           const std::optional<at::Tensor>& weight, c10::string_view norm,
                           const std::optional<at::Tensor>& table_gate,
                           const std::optional<at::Tensor>& table_scale,
                           const std::optional<at::Tensor>& table_shift);
DType check_adaln(const AdaLnArgs& args);
bool has_tables(const AdaLnArgs& args);
// "rms" -> false, "layer" -> true; anything else is a ValueError naming the op.
bool parse_norm_kind(const std::string& op, const std::string& norm);

// ---- implementations

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_cpu(const at::Tensor& x,
                                                          const at::Tensor& residual,
                                                          const std::optional<at::Tensor>& weight,
                                                          double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_cuda(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const std::optional<at::Tensor>& weight,
                                                           double eps);
void fused_add_rms_norm_inplace_cpu(at::Tensor& x, at::Tensor& residual,
                                    const std::optional<at::Tensor>& weight, double eps);
void fused_add_rms_norm_inplace_cuda(at::Tensor& x, at::Tensor& residual,
                                     const std::optional<at::Tensor>& weight, double eps);

at::Tensor layer_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, double eps);
at::Tensor layer_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps);

at::Tensor adaln_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                     const std::optional<at::Tensor>& weight, double eps, c10::string_view norm,
                     const std::optional<at::Tensor>& table_scale,
                     const std::optional<at::Tensor>& table_shift);
at::Tensor adaln_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                      const std::optional<at::Tensor>& weight, double eps, c10::string_view norm,
                      const std::optional<at::Tensor>& table_scale,
                      const std::optional<at::Tensor>& table_shift);

// rms_norm_gated: rms_norm(x, weight) * silu(gate) (or * sigmoid(gate)), normalised before it
// is gated, as Qwen3-Next's and Qwen3.5's RMSNormGated (silu) and Kimi Linear's and GLM-5
// Next's (sigmoid) compute it; math in fp32, rounded once at the end. With norm_before_gate
// false, rms_norm(T(x * silu(gate)), weight), Mamba-2's: the gated x rounded to x's dtype once
// (as the row the kernel holds), then normalised and rounded again.
at::Tensor rms_norm_gated_cpu(const at::Tensor& x, const at::Tensor& gate,
                              const std::optional<at::Tensor>& weight, double eps,
                              c10::string_view activation, bool norm_before_gate);
at::Tensor rms_norm_gated_cuda(const at::Tensor& x, const at::Tensor& gate,
                               const std::optional<at::Tensor>& weight, double eps,
                               c10::string_view activation, bool norm_before_gate);

std::tuple<at::Tensor, at::Tensor> gated_adaln_cpu(
    const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const std::optional<at::Tensor>& weight, double eps,
    c10::string_view norm, const std::optional<at::Tensor>& table_gate,
    const std::optional<at::Tensor>& table_scale, const std::optional<at::Tensor>& table_shift);
std::tuple<at::Tensor, at::Tensor> gated_adaln_cuda(
    const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const std::optional<at::Tensor>& weight, double eps,
    c10::string_view norm, const std::optional<at::Tensor>& table_gate,
    const std::optional<at::Tensor>& table_scale, const std::optional<at::Tensor>& table_shift);

}  // namespace kiln::torch_ops

// kiln's activation ops (the elementwise family): swiglu, geglu, gelu, gated_residual.
// Math in fp32, rounded once to the inputs' dtype, which every input must share (and the
// output has); every input must be on one device.
//   swiglu(gate, up=None, up_first=False)        silu(gate) * up
//   geglu(gate, up=None, approximate, up_first)  gelu(gate) * up
//     up None: gate is one packed [..., 2I] tensor whose halves are gate and up (up second
//     unless up_first), the output [..., I].
//   gelu(x, bias=None, approximate="tanh")       gelu(x + bias), bias of [x.shape[-1]]
//   gated_residual(h, y, gate)                   h + y * gate, y of h's shape, gate of h's
//     shape (per token) or [B, 1, ..., 1, D] / [1, ..., 1, D] (per sample / shared);
//   gated_residual_(h, y, gate)                  the same, written into h.
// approximate is "tanh" or "none", as F.gelu spells it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "templates/types.h"

namespace kiln::torch_ops {

// ---- shared checks (activation_checks.cpp) ----

// `other` shares `ref`'s dtype and device.
void check_same_kind(const char* op, const char* arg, const at::Tensor& other, const char* ref_arg,
                     const at::Tensor& ref);
// At least one dimension, the last one not empty.
void check_rows(const char* op, const char* arg, const at::Tensor& x);

// swiglu/geglu's inputs; returns their dtype. With `up` absent, gate's last dimension must
// be even (the packed halves). float64 passes on the CPU (see kernel_or_reference_dtype), as
// it does for gelu.
DType check_gated(const char* op, const at::Tensor& gate, const std::optional<at::Tensor>& up);
// "tanh" -> false, "none" -> true (the erf form); a ValueError naming `op` otherwise.
bool gelu_is_erf(const char* op, c10::string_view approximate);
DType check_gelu(const at::Tensor& x, const std::optional<at::Tensor>& bias);

// How gated_residual's gate broadcasts over h's rows.
enum class GateBroadcast { per_token, per_sample, shared };
struct GateLayout {
  DType dtype;
  GateBroadcast broadcast;
};
GateLayout check_gated_residual(const char* op, const at::Tensor& h, const at::Tensor& y,
                                const at::Tensor& gate);
// h may be written in place: no internal overlap, no partial overlap with y or gate.
void check_writable(const char* op, const at::Tensor& h, const at::Tensor& y,
                    const at::Tensor& gate);

// ---- CPU: kiln's fp32 reference, float64 for float64 inputs (activation_cpu.cpp) ----
// gate and up in the reference's math type (reference_math_type), from two tensors or from
// the halves of a packed one.
std::pair<at::Tensor, at::Tensor> gated_halves(const at::Tensor& gate,
                                               const std::optional<at::Tensor>& up, bool up_first);
at::Tensor swiglu_cpu(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first);
at::Tensor geglu_cpu(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                     c10::string_view approximate, bool up_first);
at::Tensor gelu_cpu(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                    c10::string_view approximate);
at::Tensor gated_residual_cpu(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate);
void gated_residual_inplace_cpu(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate);

// ---- CUDA (activation_cuda.cpp) ----
at::Tensor swiglu_cuda(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first);
// Writes into `out` (the output's shape, gate's dtype and device, not overlapping the inputs:
// the caller checks; see out_variants.cpp) where its rows collapse into one stride, as a slice
// of a wider buffer's last dimension does; false, writing nothing, where they do not.
bool swiglu_cuda_into(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first,
                      const at::Tensor& out);
at::Tensor geglu_cuda(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                      c10::string_view approximate, bool up_first);
at::Tensor gelu_cuda(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                     c10::string_view approximate);
// Writes into `out` (x's shape, dtype and device, not overlapping x or bias: the caller
// checks) where its rows collapse into one stride, as a slice of a wider buffer's last
// dimension does; false, writing nothing, where they do not.
bool gelu_cuda_into(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                    c10::string_view approximate, const at::Tensor& out);
at::Tensor gated_residual_cuda(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate);
void gated_residual_inplace_cuda(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate);

}  // namespace kiln::torch_ops

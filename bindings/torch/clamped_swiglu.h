// kiln's clamped_swiglu, GPT-OSS's expert gate (vLLM's swigluoai_and_mul). gate_up is one packed
// [..., 2I] tensor: with `interleaved` (GPT-OSS's gate_up_proj layout) gate j and up j are
// elements 2j and 2j + 1 of each row, otherwise its first and second halves. With
// g = min(gate, limit) and u = clamp(up, -limit, limit), the output [..., I] is
//   (u + 1) * g * sigmoid(alpha * g),
// math in fp32 (float64 on the CPU for float64 inputs), rounded once to gate_up's dtype.
//   clamped_swiglu(gate_up, alpha=1.702, limit=7.0, interleaved=True)          -> out
//   clamped_swiglu_backward(grad_out, gate_up, alpha, limit, interleaved)      -> dgate_up
// dgate_up has gate_up's shape and layout; as torch.clamp's, the clamps' gradient passes at the
// limits themselves and is 0 beyond them.
#pragma once

#include <ATen/core/Tensor.h>

#include "templates/types.h"

namespace kiln::torch_ops {

// gate_up's dtype (float64 passes on the CPU), at least one dimension, an even non-empty last
// one; alpha finite, limit finite and > 0.
DType check_clamped_swiglu(const char* op, const at::Tensor& gate_up, double alpha, double limit);
// The same, and grad_out of the output's shape, dtype and device.
DType check_clamped_swiglu_backward(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                    double alpha, double limit);

// ---- CPU: kiln's reference (clamped_swiglu_cpu.cpp) ----
at::Tensor clamped_swiglu_cpu(const at::Tensor& gate_up, double alpha, double limit,
                              bool interleaved);
at::Tensor clamped_swiglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                       double alpha, double limit, bool interleaved);

// ---- CUDA (activation_cuda.cpp, activation_backward_cuda.cpp) ----
at::Tensor clamped_swiglu_cuda(const at::Tensor& gate_up, double alpha, double limit,
                               bool interleaved);
at::Tensor clamped_swiglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                        double alpha, double limit, bool interleaved);

}  // namespace kiln::torch_ops

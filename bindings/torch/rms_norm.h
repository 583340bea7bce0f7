// kiln::rms_norm: y = x * rsqrt(mean(x^2, -1) + eps) * weight, math in fp32, output in x's
// dtype (rounded once, after the weight multiply).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "templates/types.h"

namespace kiln::torch_ops {

// Shared by both implementations; returns x's dtype as kiln's.
DType check_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight);

at::Tensor rms_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps);
at::Tensor rms_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps);
// Writes into `out`: contiguous, of x's shape, dtype and device, not overlapping x (the
// caller checks; see out_variants.cpp).
void rms_norm_cuda_into(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                        const at::Tensor& out);

}  // namespace kiln::torch_ops

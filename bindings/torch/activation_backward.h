// The backward ops of swiglu, geglu and gelu (what their autograd kernels in
// autograd_pointwise.cpp call). Math in fp32 (float64 on the CPU for float64
// inputs), each gradient rounded once to the inputs' dtype; grad_out has the forward
// output's shape, dtype and device. Each returns a list of new contiguous tensors:
//   swiglu_backward(grad_out, gate, up=None, up_first)         [dgate, dup], or with up None
//   geglu_backward(grad_out, gate, up=None, approximate, ...)  [dgate_up] in gate's packed
//                                                               layout (up_first honoured)
//   gelu_backward(grad_out, x, bias=None, approximate)         [dx], or [dx, dbias] with a
//                                                               bias (dbias summed in fp32)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <vector>

#include "templates/types.h"

namespace kiln::torch_ops {

// ---- shared checks (activation_backward_checks.cpp); each returns the inputs' dtype ----
DType check_gated_backward(const char* op, const at::Tensor& grad_out, const at::Tensor& gate,
                           const std::optional<at::Tensor>& up);
DType check_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x,
                          const std::optional<at::Tensor>& bias);

// ---- CPU references (activation_backward_cpu.cpp) ----
std::vector<at::Tensor> swiglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate,
                                            const std::optional<at::Tensor>& up, bool up_first);
std::vector<at::Tensor> geglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate,
                                           const std::optional<at::Tensor>& up,
                                           c10::string_view approximate, bool up_first);
std::vector<at::Tensor> gelu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                                          const std::optional<at::Tensor>& bias,
                                          c10::string_view approximate);

// ---- CUDA (activation_backward_cuda.cpp) ----
std::vector<at::Tensor> swiglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate,
                                             const std::optional<at::Tensor>& up, bool up_first);
std::vector<at::Tensor> geglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate,
                                            const std::optional<at::Tensor>& up,
                                            c10::string_view approximate, bool up_first);
std::vector<at::Tensor> gelu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& x,
                                           const std::optional<at::Tensor>& bias,
                                           c10::string_view approximate);

}  // namespace kiln::torch_ops

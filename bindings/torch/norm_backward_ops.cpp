// Schemas and implementations of the norm backward ops (see norm_backward.h). The autograd
// formulas that call them are in autograd_norm.cpp.
#include <torch/library.h>

#include "bindings/torch/norm_backward.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def(
      "rms_norm_backward(Tensor dy, Tensor x, Tensor? weight, float eps=1e-06, "
      "bool weight_grad=True) -> (Tensor, Tensor?)");
  m.def(
      "fused_add_rms_norm_backward(Tensor dy, Tensor dr, Tensor r, Tensor? weight, "
      "float eps=1e-06, bool weight_grad=True) -> (Tensor, Tensor?)");
  m.def(
      "layer_norm_backward(Tensor dy, Tensor x, Tensor? weight=None, Tensor? bias=None, "
      "float eps=1e-05, bool weight_grad=True, bool bias_grad=True) -> (Tensor, Tensor?, Tensor?)");
  m.def(
      "adaln_backward(Tensor dy, Tensor x, Tensor scale, Tensor? weight=None, float eps=1e-06, "
      "str norm=\"rms\", Tensor? table_scale=None, bool shift_per_token=False, "
      "bool scale_grad=True, bool shift_grad=True, bool weight_grad=True, "
      "bool table_scale_grad=False, bool table_shift_grad=False) -> "
      "(Tensor, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?)");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("rms_norm_backward", &kiln::torch_ops::rms_norm_backward_cpu);
  m.impl("fused_add_rms_norm_backward", &kiln::torch_ops::fused_add_rms_norm_backward_cpu);
  m.impl("layer_norm_backward", &kiln::torch_ops::layer_norm_backward_cpu);
  m.impl("adaln_backward", &kiln::torch_ops::adaln_backward_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("rms_norm_backward", &kiln::torch_ops::rms_norm_backward_cuda);
  m.impl("fused_add_rms_norm_backward", &kiln::torch_ops::fused_add_rms_norm_backward_cuda);
  m.impl("layer_norm_backward", &kiln::torch_ops::layer_norm_backward_cuda);
  m.impl("adaln_backward", &kiln::torch_ops::adaln_backward_cuda);
}

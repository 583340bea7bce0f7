// Schemas and implementations of the norm ops (see norm.h for the dtype rule).
#include <torch/library.h>

#include "bindings/torch/norm.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def(
      "fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps=1e-06) -> "
      "(Tensor, Tensor)");
  m.def(
      "fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, "
      "float eps=1e-06) -> ()");
  m.def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor");
  m.def(
      "adaln(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, float eps=1e-06, "
      "str norm=\"rms\", Tensor? table_scale=None, Tensor? table_shift=None) -> Tensor");
  m.def(
      "gated_adaln(Tensor h, Tensor y, Tensor gate, Tensor scale, Tensor shift, "
      "Tensor? weight=None, float eps=1e-06, str norm=\"rms\", Tensor? table_gate=None, "
      "Tensor? table_scale=None, Tensor? table_shift=None) -> (Tensor, Tensor)");
  m.def(
      "rms_norm_gated(Tensor x, Tensor gate, Tensor? weight=None, float eps=1e-06, "
      "str activation=\"silu\", bool norm_before_gate=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("fused_add_rms_norm", &kiln::torch_ops::fused_add_rms_norm_cpu);
  m.impl("fused_add_rms_norm_", &kiln::torch_ops::fused_add_rms_norm_inplace_cpu);
  m.impl("layer_norm", &kiln::torch_ops::layer_norm_cpu);
  m.impl("adaln", &kiln::torch_ops::adaln_cpu);
  m.impl("gated_adaln", &kiln::torch_ops::gated_adaln_cpu);
  m.impl("rms_norm_gated", &kiln::torch_ops::rms_norm_gated_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("fused_add_rms_norm", &kiln::torch_ops::fused_add_rms_norm_cuda);
  m.impl("fused_add_rms_norm_", &kiln::torch_ops::fused_add_rms_norm_inplace_cuda);
  m.impl("layer_norm", &kiln::torch_ops::layer_norm_cuda);
  m.impl("adaln", &kiln::torch_ops::adaln_cuda);
  m.impl("gated_adaln", &kiln::torch_ops::gated_adaln_cuda);
  m.impl("rms_norm_gated", &kiln::torch_ops::rms_norm_gated_cuda);
}

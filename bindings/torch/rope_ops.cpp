// kiln's RoPE ops in the torch dispatcher (schemas and implementations); the fakes are in
// bindings/python/kiln/_fakes_rope.py.
#include <torch/library.h>

#include "bindings/torch/rope.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def(
      "rope(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved=False, "
      "int rotary_dim=-1, str layout=\"bhsd\", int head_dim=-1, bool deinterleave=False) "
      "-> (Tensor, Tensor)");
  m.def(
      "rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, bool interleaved=False, "
      "int rotary_dim=-1, str layout=\"bhsd\", int head_dim=-1, bool deinterleave=False) "
      "-> ()");
  m.def(
      "rope_3d(Tensor q, Tensor k, int[] grid, float[]? rope_interpolation_scale=None, "
      "int[] base_sizes=[20, 2048, 2048], int[] patch_sizes=[1, 1], float theta=10000.0) "
      "-> (Tensor, Tensor)");
  m.def(
      "rms_norm_rope(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps=1e-05, "
      "Tensor? cos=None, Tensor? sin=None, int[]? grid=None, "
      "float[]? rope_interpolation_scale=None, int[] base_sizes=[20, 2048, 2048], "
      "int[] patch_sizes=[1, 1], float theta=10000.0, int head_dim=-1) -> (Tensor, Tensor)");
  m.def(
      "head_norm_rope(Tensor q, Tensor k, Tensor? q_weight, Tensor? k_weight, Tensor cos, "
      "Tensor sin, float eps=1e-06, bool interleaved=False, int rotary_dim=-1, "
      "str layout=\"bhsd\", int head_dim=-1) -> (Tensor, Tensor)");
  m.def(
      "head_norm_rope_(Tensor(a!) q, Tensor(b!) k, Tensor? q_weight, Tensor? k_weight, "
      "Tensor cos, Tensor sin, float eps=1e-06, bool interleaved=False, int rotary_dim=-1, "
      "str layout=\"bhsd\", int head_dim=-1) -> ()");
  m.def(
      "rope_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, "
      "bool interleaved=False, int rotary_dim=-1, str layout=\"bhsd\", int head_dim=-1, "
      "bool deinterleave=False) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("rope", &kiln::torch_ops::rope_cpu);
  m.impl("rope_", &kiln::torch_ops::rope_inplace_cpu);
  m.impl("rope_3d", &kiln::torch_ops::rope_3d_cpu);
  m.impl("rms_norm_rope", &kiln::torch_ops::rms_norm_rope_cpu);
  m.impl("head_norm_rope", &kiln::torch_ops::head_norm_rope_cpu);
  m.impl("head_norm_rope_", &kiln::torch_ops::head_norm_rope_inplace_cpu);
  m.impl("rope_backward", &kiln::torch_ops::rope_backward_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("rope", &kiln::torch_ops::rope_cuda);
  m.impl("rope_", &kiln::torch_ops::rope_inplace_cuda);
  m.impl("rope_3d", &kiln::torch_ops::rope_3d_cuda);
  m.impl("rms_norm_rope", &kiln::torch_ops::rms_norm_rope_cuda);
  m.impl("head_norm_rope", &kiln::torch_ops::head_norm_rope_cuda);
  m.impl("head_norm_rope_", &kiln::torch_ops::head_norm_rope_inplace_cuda);
  m.impl("rope_backward", &kiln::torch_ops::rope_backward_cuda);
}

// clamped_swiglu and its backward in the torch dispatcher (see clamped_swiglu.h); the fakes are
// in bindings/python/kiln/_fakes_activation.py and _fakes_pointwise_backward.py, the autograd
// registrations in autograd_pointwise.cpp and autograd_no_backward.cpp.
#include <torch/library.h>

#include "bindings/torch/clamped_swiglu.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def(
      "clamped_swiglu(Tensor gate_up, float alpha=1.702, float limit=7.0, bool interleaved=True) "
      "-> Tensor");
  m.def(
      "clamped_swiglu_backward(Tensor grad_out, Tensor gate_up, float alpha, float limit, "
      "bool interleaved) -> Tensor");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("clamped_swiglu", &kiln::torch_ops::clamped_swiglu_cpu);
  m.impl("clamped_swiglu_backward", &kiln::torch_ops::clamped_swiglu_backward_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("clamped_swiglu", &kiln::torch_ops::clamped_swiglu_cuda);
  m.impl("clamped_swiglu_backward", &kiln::torch_ops::clamped_swiglu_backward_cuda);
}

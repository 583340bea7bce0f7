// The activation backward ops in the torch dispatcher (see activation_backward.h); the fakes
// are in bindings/python/kiln/_fakes_pointwise_backward.py, the autograd registrations in
// autograd_pointwise.cpp.
#include <torch/library.h>

#include "bindings/torch/activation_backward.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def(
      "swiglu_backward(Tensor grad_out, Tensor gate, Tensor? up=None, bool up_first=False) -> "
      "Tensor[]");
  m.def(
      "geglu_backward(Tensor grad_out, Tensor gate, Tensor? up=None, str approximate=\"tanh\", "
      "bool up_first=False) -> Tensor[]");
  m.def(
      "gelu_backward(Tensor grad_out, Tensor x, Tensor? bias=None, str approximate=\"tanh\") -> "
      "Tensor[]");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("swiglu_backward", &kiln::torch_ops::swiglu_backward_cpu);
  m.impl("geglu_backward", &kiln::torch_ops::geglu_backward_cpu);
  m.impl("gelu_backward", &kiln::torch_ops::gelu_backward_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("swiglu_backward", &kiln::torch_ops::swiglu_backward_cuda);
  m.impl("geglu_backward", &kiln::torch_ops::geglu_backward_cuda);
  m.impl("gelu_backward", &kiln::torch_ops::gelu_backward_cuda);
}

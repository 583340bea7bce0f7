// The activation ops in the torch dispatcher (see activation.h for what each computes).
#include <torch/library.h>

#include "bindings/torch/activation.h"

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def("swiglu(Tensor gate, Tensor? up=None, bool up_first=False) -> Tensor");
  m.def(
      "geglu(Tensor gate, Tensor? up=None, str approximate=\"tanh\", bool up_first=False) -> "
      "Tensor");
  m.def("gelu(Tensor x, Tensor? bias=None, str approximate=\"tanh\") -> Tensor");
  m.def("gated_residual(Tensor h, Tensor y, Tensor gate) -> Tensor");
  m.def("gated_residual_(Tensor(a!) h, Tensor y, Tensor gate) -> ()");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("swiglu", &kiln::torch_ops::swiglu_cpu);
  m.impl("geglu", &kiln::torch_ops::geglu_cpu);
  m.impl("gelu", &kiln::torch_ops::gelu_cpu);
  m.impl("gated_residual", &kiln::torch_ops::gated_residual_cpu);
  m.impl("gated_residual_", &kiln::torch_ops::gated_residual_inplace_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("swiglu", &kiln::torch_ops::swiglu_cuda);
  m.impl("geglu", &kiln::torch_ops::geglu_cuda);
  m.impl("gelu", &kiln::torch_ops::gelu_cuda);
  m.impl("gated_residual", &kiln::torch_ops::gated_residual_cuda);
  m.impl("gated_residual_", &kiln::torch_ops::gated_residual_inplace_cuda);
}

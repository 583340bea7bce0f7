// kiln's ops in the torch dispatcher: the library itself and rms_norm. Every other family
// adds its schemas with TORCH_LIBRARY_FRAGMENT(kiln, m) and its implementations with
// TORCH_LIBRARY_IMPL in its own <family>_ops.cpp. Fake (meta) implementations are
// registered from Python (bindings/python/kiln/_fakes.py) so torch.compile can trace them.
#include <torch/library.h>

#include "bindings/torch/rms_norm.h"

TORCH_LIBRARY(kiln, m) {
  m.def("rms_norm(Tensor x, Tensor? weight, float eps=1e-06) -> Tensor");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("rms_norm", &kiln::torch_ops::rms_norm_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("rms_norm", &kiln::torch_ops::rms_norm_cuda);
}

// `out=` overloads for the ops a serving engine calls with preallocated outputs (vLLM's
// rms_norm(out, x, w, eps) and silu_and_mul(out, x)): rms_norm.out and swiglu.out; and
// gelu.out, which writes into a slice of a wider buffer (FLUX's single blocks concatenate the
// attention output and the MLP's activation before one projection, so each can be written
// where it goes). The schema returns nothing (a custom op returning an alias of its input
// cannot be functionalised by torch.compile); the Python wrappers return `out`. The kernel
// writes into `out` directly when it is contiguous (gelu: its rows one stride apart) and
// shares no memory with an input; otherwise the result is computed into a new tensor and
// copied in, so any `out` layout is correct.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "bindings/torch/activation.h"
#include "bindings/torch/rms_norm.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

std::string sizes_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(sizes[d]);
  }
  return text + "]";
}

// `out` must have the result's shape, dtype and device.
void check_out(const char* op, const at::Tensor& out, at::IntArrayRef shape,
               const at::Tensor& like) {
  if (out.scalar_type() != like.scalar_type()) {
    fail_type(op, "out", dtype_text(like.scalar_type()) + " (the inputs' dtype)",
              dtype_text(out.scalar_type()));
  }
  if (out.device() != like.device()) {
    fail_value(op, "out", "a tensor on " + like.device().str() + " (as the inputs)",
               out.device().str());
  }
  if (out.sizes() != shape) {
    fail_value(op, "out", "shape " + sizes_text(shape), shape_text(out));
  }
}

// Tensors of different allocations share nothing; within one, ATen's overlap check answers
// (it calls any strided view "too hard", so asking it first would refuse every slice).
bool shares_no_memory(const at::Tensor& out, std::initializer_list<const at::Tensor*> inputs) {
  for (const at::Tensor* input : inputs) {
    if (input && input->defined() && out.storage().is_alias_of(input->storage()) &&
        at::get_overlap_status(out, *input) != at::MemOverlapStatus::No) {
      return false;
    }
  }
  return true;
}

// Whether the kernel may write `out` in place of a new output.
bool writes_directly(const at::Tensor& out, std::initializer_list<const at::Tensor*> inputs) {
  return out.is_contiguous() && shares_no_memory(out, inputs);
}

c10::SmallVector<std::int64_t, 6> gated_shape(const at::Tensor& gate,
                                              const std::optional<at::Tensor>& up) {
  c10::SmallVector<std::int64_t, 6> sizes(gate.sizes().begin(), gate.sizes().end());
  if (!up && !sizes.empty()) {
    sizes.back() /= 2;
  }
  return sizes;
}

void rms_norm_out_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                      const at::Tensor& out) {
  check_rms_norm(x, weight);
  check_out("rms_norm", out, x.sizes(), x);
  const_cast<at::Tensor&>(out).copy_(rms_norm_cpu(x, weight, eps));
}

void rms_norm_out_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                       const at::Tensor& out) {
  check_rms_norm(x, weight);
  check_out("rms_norm", out, x.sizes(), x);
  const at::Tensor* w = weight ? &*weight : nullptr;
  if (writes_directly(out, {&x, w})) {
    rms_norm_cuda_into(x, weight, eps, out);
  } else {
    const_cast<at::Tensor&>(out).copy_(rms_norm_cuda(x, weight, eps));
  }
}

void swiglu_out_cpu(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first,
                    const at::Tensor& out) {
  check_gated("swiglu", gate, up);
  check_out("swiglu", out, gated_shape(gate, up), gate);
  const_cast<at::Tensor&>(out).copy_(swiglu_cpu(gate, up, up_first));
}

void swiglu_out_cuda(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first,
                     const at::Tensor& out) {
  check_gated("swiglu", gate, up);
  check_out("swiglu", out, gated_shape(gate, up), gate);
  const at::Tensor* u = up ? &*up : nullptr;
  if (!shares_no_memory(out, {&gate, u}) || !swiglu_cuda_into(gate, up, up_first, out)) {
    const_cast<at::Tensor&>(out).copy_(swiglu_cuda(gate, up, up_first));
  }
}

void gelu_out_cpu(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                  c10::string_view approximate, const at::Tensor& out) {
  check_gelu(x, bias);
  check_out("gelu", out, x.sizes(), x);
  const_cast<at::Tensor&>(out).copy_(gelu_cpu(x, bias, approximate));
}

void gelu_out_cuda(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                   c10::string_view approximate, const at::Tensor& out) {
  check_gelu(x, bias);
  check_out("gelu", out, x.sizes(), x);
  const at::Tensor* b = bias ? &*bias : nullptr;
  if (!shares_no_memory(out, {&x, b}) || !gelu_cuda_into(x, bias, approximate, out)) {
    const_cast<at::Tensor&>(out).copy_(gelu_cuda(x, bias, approximate));
  }
}

}  // namespace
}  // namespace kiln::torch_ops

TORCH_LIBRARY_FRAGMENT(kiln, m) {
  m.def("rms_norm.out(Tensor x, Tensor? weight, float eps=1e-06, *, Tensor(a!) out) -> ()");
  m.def("swiglu.out(Tensor gate, Tensor? up=None, bool up_first=False, *, Tensor(a!) out) -> ()");
  m.def("gelu.out(Tensor x, Tensor? bias=None, str approximate=\"tanh\", *, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(kiln, CPU, m) {
  m.impl("rms_norm.out", &kiln::torch_ops::rms_norm_out_cpu);
  m.impl("swiglu.out", &kiln::torch_ops::swiglu_out_cpu);
  m.impl("gelu.out", &kiln::torch_ops::gelu_out_cpu);
}

TORCH_LIBRARY_IMPL(kiln, CUDA, m) {
  m.impl("rms_norm.out", &kiln::torch_ops::rms_norm_out_cuda);
  m.impl("swiglu.out", &kiln::torch_ops::swiglu_out_cuda);
  m.impl("gelu.out", &kiln::torch_ops::gelu_out_cuda);
}

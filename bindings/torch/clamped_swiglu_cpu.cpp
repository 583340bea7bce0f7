// The CPU implementations of clamped_swiglu and its backward, kiln's reference: plain ATen math
// in fp32 (float64 for float64 inputs), each result rounded once to gate_up's dtype.
#include <ATen/ATen.h>

#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void require_cpu(const char* op, const at::Tensor& x) {
  if (!x.device().is_cpu()) {
    fail_value(op, "gate_up", "a CPU or CUDA tensor", x.device().str());
  }
}

// gate and up in the reference's math type: the pairs of each row, or its halves.
std::pair<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& gate_up, bool interleaved) {
  const at::Tensor x = gate_up.to(reference_math_type(gate_up));
  const std::int64_t half = x.size(-1) / 2;
  if (interleaved) {
    return {x.slice(-1, 0, c10::nullopt, 2), x.slice(-1, 1, c10::nullopt, 2)};
  }
  return {x.narrow(-1, 0, half), x.narrow(-1, half, half)};
}

}  // namespace

at::Tensor clamped_swiglu_cpu(const at::Tensor& gate_up, double alpha, double limit,
                              bool interleaved) {
  check_clamped_swiglu("clamped_swiglu", gate_up, alpha, limit);
  require_cpu("clamped_swiglu", gate_up);
  const auto [gate, up] = gate_and_up(gate_up, interleaved);
  const at::Tensor g = at::clamp_max(gate, limit);
  const at::Tensor u = at::clamp(up, -limit, limit);
  return ((u + 1) * g * at::sigmoid(g * alpha)).to(gate_up.scalar_type()).contiguous();
}

at::Tensor clamped_swiglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                       double alpha, double limit, bool interleaved) {
  check_clamped_swiglu_backward(grad_out, gate_up, alpha, limit);
  require_cpu("clamped_swiglu_backward", gate_up);
  const auto [gate, up] = gate_and_up(gate_up, interleaved);
  const at::Tensor dy = grad_out.to(gate.scalar_type());
  const at::Tensor g = at::clamp_max(gate, limit);
  const at::Tensor u = at::clamp(up, -limit, limit);
  const at::Tensor s = at::sigmoid(g * alpha);
  // d(g * sigmoid(alpha g))/dg = s * (1 + alpha g (1 - s)); each clamp passes its gradient
  // where its input lies within the limits, the limits included.
  const at::Tensor dgate =
      at::where(gate <= limit, dy * (u + 1) * s * (1 + alpha * g * (1 - s)), 0.0);
  const at::Tensor dup = at::where((up >= -limit).logical_and(up <= limit), dy * g * s, 0.0);
  const at::Tensor packed =
      interleaved ? at::stack({dgate, dup}, -1).flatten(-2) : at::cat({dgate, dup}, -1);
  return packed.to(gate_up.scalar_type()).contiguous();
}

}  // namespace kiln::torch_ops

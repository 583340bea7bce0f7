// Argument checks shared by the CPU and CUDA implementations of the activation ops, so both
// reject the same inputs with the same words.
#include <ATen/MemoryOverlap.h>

#include <cmath>
#include <string>

#include "bindings/torch/activation.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {

void check_same_kind(const char* op, const char* arg, const at::Tensor& other, const char* ref_arg,
                     const at::Tensor& ref) {
  if (other.device() != ref.device()) {
    fail_value(op, arg, "device " + ref.device().str() + " (as " + ref_arg + ")",
               other.device().str());
  }
  if (other.scalar_type() != ref.scalar_type()) {
    fail_type(op, arg, "dtype " + dtype_text(ref.scalar_type()) + " (as " + ref_arg + ")",
              dtype_text(other.scalar_type()));
  }
}

void check_rows(const char* op, const char* arg, const at::Tensor& x) {
  if (x.dim() == 0) {
    fail_value(op, arg, "at least 1 dimension", "a 0-dimensional tensor");
  }
  if (x.size(-1) <= 0) {
    fail_value(op, arg, "a last dimension > 0", shape_text(x));
  }
}

DType check_gated(const char* op, const at::Tensor& gate, const std::optional<at::Tensor>& up) {
  const DType dtype = kernel_or_reference_dtype(op, "gate", gate);
  check_rows(op, "gate", gate);
  if (up) {
    check_same_kind(op, "up", *up, "gate", gate);
    if (up->sizes() != gate.sizes()) {
      fail_value(op, "up", "shape " + shape_text(gate) + " (as gate)", shape_text(*up));
    }
  } else if (gate.size(-1) % 2 != 0) {
    fail_value(op, "gate",
               "a packed last dimension 2*I (gate and up halves) when up is None, so an even "
               "one",
               shape_text(gate));
  }
  return dtype;
}

DType check_clamped_swiglu(const char* op, const at::Tensor& gate_up, double alpha, double limit) {
  const DType dtype = kernel_or_reference_dtype(op, "gate_up", gate_up);
  check_rows(op, "gate_up", gate_up);
  if (gate_up.size(-1) % 2 != 0) {
    fail_value(op, "gate_up", "a packed last dimension 2*I (gate and up pairs), so an even one",
               shape_text(gate_up));
  }
  if (!std::isfinite(alpha)) {
    fail_value(op, "alpha", "a finite number", std::to_string(alpha));
  }
  if (!std::isfinite(limit) || limit <= 0) {
    fail_value(op, "limit", "a finite number > 0", std::to_string(limit));
  }
  return dtype;
}

bool gelu_is_erf(const char* op, c10::string_view approximate) {
  if (approximate == "tanh") {
    return false;
  }
  if (approximate == "none") {
    return true;
  }
  fail_value(op, "approximate", "'tanh' or 'none'",
             "'" + std::string(approximate.data(), approximate.size()) + "'");
}

DType check_gelu(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  const DType dtype = kernel_or_reference_dtype("gelu", "x", x);
  check_rows("gelu", "x", x);
  if (bias) {
    check_parameter("gelu", "bias", *bias, x);
  }
  return dtype;
}

GateLayout check_gated_residual(const char* op, const at::Tensor& h, const at::Tensor& y,
                                const at::Tensor& gate) {
  GateLayout layout{kiln_dtype(op, "h", h), GateBroadcast::per_token};
  check_rows(op, "h", h);
  check_same_kind(op, "y", y, "h", h);
  if (y.sizes() != h.sizes()) {
    fail_value(op, "y", "shape " + shape_text(h) + " (as h)", shape_text(y));
  }
  check_same_kind(op, "gate", gate, "h", h);
  // gate's shape, padded on the left with 1s to h's rank (torch's broadcasting).
  const std::int64_t dims = h.dim();
  const std::int64_t pad = dims - gate.dim();
  auto size = [&](std::int64_t d) { return d < pad ? std::int64_t{1} : gate.size(d - pad); };
  bool same = pad >= 0;
  bool sample_rows_one = pad >= 0 && size(dims - 1) == h.size(-1);
  for (std::int64_t d = 0; pad >= 0 && d < dims; ++d) {
    same = same && size(d) == h.size(d);
    if (d >= 1 && d + 1 < dims) {
      sample_rows_one = sample_rows_one && size(d) == 1;
    }
  }
  if (same) {
    return layout;
  }
  if (sample_rows_one && dims >= 2 && (size(0) == 1 || size(0) == h.size(0))) {
    const bool one_gate = size(0) == 1 || h.size(0) == 1;
    layout.broadcast = one_gate ? GateBroadcast::shared : GateBroadcast::per_sample;
    return layout;
  }
  fail_value(op, "gate",
             "a shape that broadcasts over h " + shape_text(h) +
                 " per sample ([B, 1, ..., 1, D] or [1, ..., 1, D]) or per token (h's shape)",
             shape_text(gate));
}

void check_writable(const char* op, const at::Tensor& h, const at::Tensor& y,
                    const at::Tensor& gate) {
  if (at::has_internal_overlap(h) == at::MemOverlap::Yes) {
    fail_value(op, "h", "a tensor whose elements have distinct memory (it is written in place)",
               "an expanded or self-overlapping tensor of shape " + shape_text(h));
  }
  for (const auto& [arg, other] : {std::pair{"y", &y}, std::pair{"gate", &gate}}) {
    if (at::get_overlap_status(h, *other) == at::MemOverlapStatus::Partial) {
      fail_value(op, arg, "no partial overlap with h (written in place)",
                 "a tensor sharing part of h's memory");
    }
  }
}

}  // namespace kiln::torch_ops

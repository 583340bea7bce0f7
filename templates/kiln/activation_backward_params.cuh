// The single by-value parameter of the activation backward kernels
// (templates/kiln/activation_backward.cuh). Included by the kernels and by host code that
// fills it, so it holds plain data only and includes nothing.
//
// Every operand is a rows x width matrix with its own row stride (in elements); a stride of
// 0 broadcasts one row to every row (gelu's bias). What each op reads and writes:
//   swiglu_backward / geglu_backward: a = gate, b = up, dy -> out0 = dgate, out1 = dup
//   clamped_swiglu_backward:          the same, or with interleaved pairs a = the packed gate_up
//                                     row, dy -> out0 = its packed gradient (b, out1 unused)
//   gelu_backward:                    a = x, b = bias (or null), dy -> out0 = dx, and with a
//                                     bias the fp32 column sums of dx, one row per row group
//                                     (the CTAs along blockIdx.y), in `partials`.
#pragma once

namespace kiln {

struct ActivationBackwardParams {
  void* out0;
  void* out1;       // null when the op has one output
  float* partials;  // [row groups, width] fp32; null unless gelu has a bias
  const void* a;
  const void* b;  // null when the op has no second operand
  const void* dy;
  long long rows;
  long long a_row_stride;
  long long b_row_stride;
  long long dy_row_stride;
  long long out0_row_stride;
  long long out1_row_stride;
  // clamped_swiglu's gate scale and clamp; unused by the other ops.
  float alpha;
  float limit;
};

}  // namespace kiln

// The single by-value parameter of kiln::elementwise (the activation family: swiglu, geglu,
// gelu, gated_residual). Included by the kernel template and by host code that fills it, so
// it holds plain data only and includes nothing but the plain divisor.
//
// Every operand is a rows x width matrix with its own row stride (in elements). A stride of 0
// broadcasts one row to every row (gelu's bias, a gate shared by all tokens). Which operands
// an op reads: swiglu/geglu a = gate, b = up; gelu a = x, b = bias; gated_residual a = h,
// b = y, c = gate; clamped_swiglu a = the packed gate_up row (b = its up half when the halves
// are not interleaved).
#pragma once

#include "kiln/divisor.cuh"

namespace kiln {

struct ElementwiseParams {
  void* out;
  const void* a;
  const void* b;  // null when the op has no second operand
  const void* c;  // null when the op has no third operand
  long long rows;
  long long a_row_stride;
  long long b_row_stride;
  long long c_row_stride;
  long long out_row_stride;
  // Rows that share one row of c when c is broadcast per sample (gated_residual's
  // [B, 1, D] gate over [B, T, D] rows: T), as make_divisor gives it; unused otherwise.
  Divisor rows_per_sample;
  // clamped_swiglu's gate scale and clamp (GPT-OSS: 1.702 and 7); unused by the other ops.
  float alpha;
  float limit;
};

}  // namespace kiln

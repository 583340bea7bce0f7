// The single by-value parameter of kiln::norm, the kernel behind fused_add_rms_norm,
// layer_norm, adaln and gated_adaln. Included by the kernel template and by host code that
// fills it, so it holds plain data only and includes nothing but the plain divisor. Pointers
// a specialisation does not use are null; strides are in elements.
#pragma once

#include "kiln/divisor.cuh"

namespace kiln {

// Bits of kiln::norm's FEATURES argument (the family descriptor derives them from the op
// and the problem's flags).
struct NormFeature {
  static constexpr unsigned layer = 1u;       // subtract the mean (LayerNorm), else RMS
  static constexpr unsigned weight = 2u;      // multiply by weight[i]
  static constexpr unsigned bias = 4u;        // add bias[i]
  static constexpr unsigned residual = 8u;    // s = x + residual, stored to sum_out
  static constexpr unsigned gate = 16u;       // s = x + y * gate, stored to sum_out
  static constexpr unsigned modulate = 32u;   // * (1 + scale) + shift
  static constexpr unsigned table = 64u;      // modulation operands add a table row
  static constexpr unsigned in_place = 128u;  // outputs alias inputs: coherent loads
  // The modulation operands are one row per sample ([B, 1, D]): every row of a sample reads
  // the same one, so they are read where used, through L1, like the per-column operands,
  // instead of streamed and held with the row.
  static constexpr unsigned per_sample = 256u;
};

// A modulation operand (scale, shift or gate) of shape [B, T or 1, D]: element (b, t, i) is
// at data[b * batch_stride + t * token_stride + i] (token_stride 0 broadcasts over tokens),
// plus table[i] when the kernel adds a table row (diffusers' scale_shift_table), so that
// table + temb is never materialised.
struct NormModulation {
  const void* data;
  const void* table;
  long long batch_stride;
  long long token_stride;
};

struct NormParams {
  // What every specialisation reads first, together at the front: a single row is waited on
  // from its first instruction, and each constant-cache line of the parameters it touches
  // is a miss (~0.1 us) before its first load can issue.
  void* out;      // the normalised (and modulated) rows
  const void* x;  // the rows to normalise (h for gated_adaln)
  const void* weight;
  long long rows;
  long long x_row_stride;
  long long out_row_stride;
  float eps;
  void* sum_out;         // fused ops: the new residual stream (x + residual, or h + y * gate)
  const void* residual;  // fused_add_rms_norm: added to x
  const void* y;         // gated_adaln: added to h after the gate multiply
  const void* bias;
  long long residual_row_stride;
  long long y_row_stride;
  long long sum_row_stride;
  long long tokens;  // rows per sample (T), to find a row's modulation operands
  // tokens as a multiply-high magic: a row's sample without a 64-bit division on the way to
  // the row's first load.
  Divisor tokens_divisor;
  NormModulation scale;
  NormModulation shift;
  NormModulation gate;
};

#ifndef __CUDACC_RTC__
// Sets the rows per sample and their magic together.
inline void set_tokens(NormParams& params, long long tokens) {
  params.tokens = tokens;
  params.tokens_divisor = make_divisor(static_cast<unsigned long long>(tokens));
}
#endif

}  // namespace kiln

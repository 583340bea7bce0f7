// The single by-value parameter of kiln::norm, the kernel behind fused_add_rms_norm,
// layer_norm, adaln and gated_adaln. Included by the kernel template and by host code that
// fills it, so it holds plain data only and includes nothing. Pointers a specialisation does
// not use are null; strides are in elements.
#pragma once

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
  void* out;             // the normalised (and modulated) rows
  void* sum_out;         // fused ops: the new residual stream (x + residual, or h + y * gate)
  const void* x;         // the rows to normalise (h for gated_adaln)
  const void* residual;  // fused_add_rms_norm: added to x
  const void* y;         // gated_adaln: added to h after the gate multiply
  const void* weight;
  const void* bias;
  NormModulation scale;
  NormModulation shift;
  NormModulation gate;
  long long rows;
  long long tokens;  // rows per sample (T), to find a row's modulation operands
  long long x_row_stride;
  long long residual_row_stride;
  long long y_row_stride;
  long long out_row_stride;
  long long sum_row_stride;
  float eps;
};

}  // namespace kiln

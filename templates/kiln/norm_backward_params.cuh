// The single by-value parameter of kiln::norm_backward, the kernel behind the backward ops
// of rms_norm, fused_add_rms_norm, layer_norm and adaln. Included by the kernel template and
// by host code that fills it, so it holds plain data only and includes nothing. Pointers a
// specialisation does not use are null; strides are in elements.
#pragma once

namespace kiln {

// Bits of kiln::norm_backward's FEATURES argument (the family descriptor derives them from
// the op and the problem's flags).
struct NormBackwardFeature {
  static constexpr unsigned layer = 1u;         // LayerNorm (the mean is subtracted), else RMS
  static constexpr unsigned weight = 2u;        // the forward multiplied by weight[i]
  static constexpr unsigned residual = 4u;      // dx += dr (fused_add_rms_norm's second output)
  static constexpr unsigned modulate = 8u;      // the forward applied * (1 + scale) + shift
  static constexpr unsigned table = 16u;        // the scale operand adds a table row
  static constexpr unsigned dy_sum = 32u;       // sum dy over an item's rows (dbias, dshift,
                                                // the shift table row's gradient)
  static constexpr unsigned scale_sum = 64u;    // sum dy * n over an item's rows (dscale per
                                                // sample, the scale table row's gradient)
  static constexpr unsigned weight_sum = 128u;  // sum dn * xhat over an item's rows (dweight)
  static constexpr unsigned scale_rows = 256u;  // write dy * n per token (dscale per token)
};

// The rows are split into `segments` segments of `segment_rows` rows (samples, when a sum
// per sample is needed; else one segment of every row), and each segment into `slots`
// items: item (segment s, slot k) holds the segment's rows t with t % slots == k. One group
// of threads reduces one item at a time and writes the item's sums to row `item` of each
// partial buffer ([segments * slots, hidden] fp32), so the layout depends on the problem
// and the row counts only, never on the launch config; the host adds the partial rows up.
struct NormBackwardParams {
  void* dx;               // [rows, hidden], contiguous
  void* dscale;           // scale_rows: dy * n per token, [rows, hidden]
  float* weight_partial;  // weight_sum: sums of dn * xhat
  float* dy_partial;      // dy_sum: sums of dy
  float* scale_partial;   // scale_sum: sums of dy * n
  const void* dy;
  const void* dr;  // residual: the gradient of the residual stream output
  const void* x;   // the forward's normalised input (the residual stream for fused_add)
  const void* weight;
  const void* scale;        // [B, 1 or T, hidden]: element (b, t, i) at
  const void* table_scale;  // scale[b * scale_batch_stride + t * scale_token_stride + i]
  long long scale_batch_stride;
  long long scale_token_stride;
  long long rows;
  long long tokens;  // rows per sample (T), to find a row's scale operand
  long long segments;
  long long segment_rows;
  long long slots;
  long long dy_row_stride;
  long long dr_row_stride;
  long long x_row_stride;
  float eps;
};

// The single by-value parameter of kiln::sum_partials, which adds up the partial rows above:
// out[s, i] = the sum over k < items of partial[s * items + k, i], rounded once to the
// gradient's dtype, for each of `segments` segments ([segments, hidden] out, contiguous).
struct PartialSumParams {
  const float* partial;  // [segments * items, hidden], contiguous
  void* out;
  long long items;
  long long segments;
};

}  // namespace kiln

// The backward of the normalisation ops where nothing is summed across rows: every
// parameter frozen (LoRA fine-tuning), or only per-token gradients (dx, dscale per token).
// Same math and parameters as kiln::norm_backward (see norm_backward.cuh), but each row is
// independent, so the grid covers the rows one group each, as the forward norms' does,
// instead of kiln::norm_backward's items of several rows with the next one in flight. The
// tuner weighs the two (NormBackwardFamily::item_kernel); on an H200, rms_norm 2688 x 4096
// bf16 with a frozen weight took 1.06x the time of a copy of its bytes here, 1.23x on the
// items (BENCHMARKS.md, "One row a group where nothing is summed").
//
// Every operand of the row, the per-column ones included, is loaded before the first
// reduction, so no load waits behind a barrier, and the row sums travel together: RMS takes
// one reduction (the sum of squares with the sum of g * x, since mean(g * xhat) = rstd *
// mean(g * x)); LayerNorm two (the mean, then the centred squares with the sums of g and
// g * (x - mean)).
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/norm_backward_layout.cuh"
#include "kiln/norm_backward_params.cuh"

namespace kiln {

template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS, unsigned F>
__global__ void __launch_bounds__(CTA_THREADS) norm_backward_rows(const NormBackwardParams p) {
  begin_dependent_grid();
  using Layout = NormBackwardLayout<T, HIDDEN, VEC_BYTES, THREADS_PER_ROW, CTA_THREADS, F>;
  static_assert((F & (NormBackwardFeature::weight_sum | NormBackwardFeature::dy_sum |
                      NormBackwardFeature::scale_sum)) == 0,
                "sums across rows need kiln::norm_backward's items");

  const int lane = static_cast<int>(threadIdx.x) % THREADS_PER_ROW;
  const int group = static_cast<int>(threadIdx.x) / THREADS_PER_ROW;
  auto column = [&](int step) { return (step * THREADS_PER_ROW + lane) * Layout::kVec; };
  // Only the last step can run past the row, and only when the split does not divide it.
  auto in_row = [&](int step) {
    return Layout::kExact || step + 1 < Layout::kSteps || column(step) < HIDDEN;
  };

  int parity = 0;
  // Every thread runs the same iterations: the reductions may synchronise the whole CTA.
  for (long long first = static_cast<long long>(blockIdx.x) * Layout::kRowsPerCta; first < p.rows;
       first += static_cast<long long>(gridDim.x) * Layout::kRowsPerCta) {
    const long long row = first + group;
    const bool active = row < p.rows;

    // Zeros where there is no row, so they add nothing to the sums.
    Raw<VEC_BYTES> x[Layout::kSteps];
    Raw<VEC_BYTES> dy[Layout::kSteps];
    Raw<VEC_BYTES> dr[Layout::kResidual ? Layout::kSteps : 1];
    Raw<VEC_BYTES> scale[Layout::kModulate ? Layout::kSteps : 1];
    Raw<VEC_BYTES> weight[Layout::kWeight ? Layout::kSteps : 1];
    Raw<VEC_BYTES> table[Layout::kTable ? Layout::kSteps : 1];
    const T* scale_row = nullptr;
    if constexpr (Layout::kModulate) scale_row = norm_backward_scale_row<T>(p, row);
#pragma unroll
    for (int step = 0; step < Layout::kSteps; ++step) {
#pragma unroll
      for (int w = 0; w < Layout::kWords; ++w) {
        x[step].words[w] = 0u;
        dy[step].words[w] = 0u;
        if constexpr (Layout::kResidual) dr[step].words[w] = 0u;
        if constexpr (Layout::kModulate) scale[step].words[w] = 0u;
        if constexpr (Layout::kWeight) weight[step].words[w] = 0u;
        if constexpr (Layout::kTable) table[step].words[w] = 0u;
      }
      if (!active || !in_row(step)) continue;
      const int col = column(step);
      x[step] = load_global_nc<VEC_BYTES>(static_cast<const T*>(p.x) + row * p.x_row_stride + col);
      dy[step] =
          load_global_nc<VEC_BYTES>(static_cast<const T*>(p.dy) + row * p.dy_row_stride + col);
      if constexpr (Layout::kResidual) {
        dr[step] =
            load_global_nc<VEC_BYTES>(static_cast<const T*>(p.dr) + row * p.dr_row_stride + col);
      }
      if constexpr (Layout::kModulate) scale[step] = load_global_nc<VEC_BYTES>(scale_row + col);
      if constexpr (Layout::kWeight) {
        weight[step] = load_global_nc<VEC_BYTES>(static_cast<const T*>(p.weight) + col);
      }
      if constexpr (Layout::kTable) {
        table[step] = load_global_nc<VEC_BYTES>(static_cast<const T*>(p.table_scale) + col);
      }
    }

    // g = dy [* (1 + scale)] [* weight], the gradient of the normalised row.
    auto g_at = [&](int step, int i) {
      float g = get_element<T>(dy[step], i);
      if constexpr (Layout::kModulate) {
        float s = get_element<T>(scale[step], i);
        if constexpr (Layout::kTable) s += get_element<T>(table[step], i);
        g *= 1.0f + s;
      }
      if constexpr (Layout::kWeight) g *= get_element<T>(weight[step], i);
      return g;
    };

    float mean = 0.0f;
    if constexpr (Layout::kLayer) {
      float sum[1] = {0.0f};
#pragma unroll
      for (int step = 0; step < Layout::kSteps; ++step) {
#pragma unroll
        for (int i = 0; i < Layout::kVec; ++i) sum[0] += get_element<T>(x[step], i);
      }
      group_sums<THREADS_PER_ROW, CTA_THREADS>(sum, parity);
      parity ^= 1;
      mean = sum[0] * Layout::kInvHidden;
    }
    // sums[0]: squares of x - mean; sums[1]: g * (x - mean); sums[2] (LayerNorm): g. Past
    // the row g is zero, but a centred zero would count mean^2.
    float sums[Layout::kLayer ? 3 : 2] = {};
#pragma unroll
    for (int step = 0; step < Layout::kSteps; ++step) {
      if (Layout::kLayer && !in_row(step)) continue;
#pragma unroll
      for (int i = 0; i < Layout::kVec; ++i) {
        const float centred = get_element<T>(x[step], i) - mean;
        const float g = g_at(step, i);
        sums[0] += centred * centred;
        sums[1] += g * centred;
        if constexpr (Layout::kLayer) sums[2] += g;
      }
    }
    group_sums<THREADS_PER_ROW, CTA_THREADS>(sums, parity);
    parity ^= 1;
    if (!active) continue;
    const float rstd = rsqrtf(sums[0] * Layout::kInvHidden + p.eps);
    const float gx_mean = sums[1] * Layout::kInvHidden * rstd;  // mean(g * xhat)
    float g_mean = 0.0f;                                        // mean(g), LayerNorm's only
    if constexpr (Layout::kLayer) g_mean = sums[2] * Layout::kInvHidden;

    T* const dx_row = static_cast<T*>(p.dx) + row * HIDDEN;
#pragma unroll
    for (int step = 0; step < Layout::kSteps; ++step) {
      if (!in_row(step)) continue;
      float result[Layout::kVec];
      float dscale[Layout::kScalePerToken ? Layout::kVec : 1];
#pragma unroll
      for (int i = 0; i < Layout::kVec; ++i) {
        const float xhat = (get_element<T>(x[step], i) - mean) * rstd;
        float value = rstd * (g_at(step, i) - g_mean - xhat * gx_mean);
        if constexpr (Layout::kResidual) value += get_element<T>(dr[step], i);
        result[i] = value;
        if constexpr (Layout::kScalePerToken) {
          const float n = Layout::kWeight ? xhat * get_element<T>(weight[step], i) : xhat;
          dscale[i] = get_element<T>(dy[step], i) * n;
        }
      }
      store_floats<T, VEC_BYTES>(dx_row + column(step), result);
      if constexpr (Layout::kScalePerToken) {
        store_floats<T, VEC_BYTES>(static_cast<T*>(p.dscale) + row * HIDDEN + column(step), dscale);
      }
    }
  }
}

}  // namespace kiln

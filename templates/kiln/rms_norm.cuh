// RMSNorm: out[r, i] = T(x[r, i] * rsqrt(mean_i(x[r, i]^2) + eps) * weight[i]), all math
// in fp32 and rounded once.
//
// A row is split among THREADS_PER_ROW threads, each owning VEC-element vectors strided
// THREADS_PER_ROW vectors apart, so every load instruction of a group is contiguous. The
// hidden size is a template argument: the loops unroll completely and a thread keeps its
// part of the row in registers between the reduction and the normalisation, so x is read
// from memory exactly once.
#pragma once

#include "kiln/common.cuh"
#include "kiln/rms_norm_params.cuh"

namespace kiln {

template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS,
          bool HAS_WEIGHT>
__global__ void __launch_bounds__(CTA_THREADS) rms_norm(const RmsNormParams p) {
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr int kStride = kVec * THREADS_PER_ROW;  // elements one step of a group covers
  constexpr int kSteps = (HIDDEN + kStride - 1) / kStride;
  constexpr bool kExact = HIDDEN % kStride == 0;
  constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW;
  constexpr float kInvHidden = 1.0f / HIDDEN;
  static_assert(kVec >= 1 && VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(HIDDEN % kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");

  const int lane = static_cast<int>(threadIdx.x) % THREADS_PER_ROW;
  const int row_in_cta = static_cast<int>(threadIdx.x) / THREADS_PER_ROW;
  const T* const x = static_cast<const T*>(p.x);
  const T* const weight = static_cast<const T*>(p.weight);
  T* const out = static_cast<T*>(p.out);

  // Every thread runs the same number of iterations, even past the last row, because the
  // row reduction may synchronise the whole CTA.
  for (long long first_row = static_cast<long long>(blockIdx.x) * kRowsPerCta; first_row < p.rows;
       first_row += static_cast<long long>(gridDim.x) * kRowsPerCta) {
    const long long row = first_row + row_in_cta;
    const bool row_active = row < p.rows;
    const T* const x_row = x + row * p.x_row_stride;

    // Zeros past the row, or for a thread with no row, add nothing to the sum of squares.
    float values[kSteps][kVec];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) values[step][i] = 0.0f;
    }
    // The weight is loaded raw (half the registers of floats for 16-bit T) together with the
    // row, before the reduction, so its latency overlaps the row's instead of following it.
    Raw<VEC_BYTES> weight_raw[HAS_WEIGHT ? kSteps : 1];
    if (row_active) {
      // All loads of the row are issued before any is used, so they are in flight together.
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int column = (step * THREADS_PER_ROW + lane) * kVec;
        // Only the last step can run past the row, and only when the split does not divide it.
        if (kExact || step + 1 < kSteps || column < HIDDEN) {
          load_floats_nc<T, VEC_BYTES>(x_row + column, values[step]);
          if constexpr (HAS_WEIGHT) weight_raw[step] = load_global_nc<VEC_BYTES>(weight + column);
        }
      }
    }

    // One partial sum per vector keeps the dependent chains short.
    float sum_squares = 0.0f;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      float partial = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) partial += values[step][i] * values[step][i];
      sum_squares += partial;
    }

    sum_squares = group_sum<THREADS_PER_ROW, CTA_THREADS>(sum_squares);
    const float scale = rsqrtf(sum_squares * kInvHidden + p.eps);

    if (row_active) {
      T* const out_row = out + row * p.out_row_stride;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int column = (step * THREADS_PER_ROW + lane) * kVec;
        if (kExact || step + 1 < kSteps || column < HIDDEN) {
          float result[kVec];
          if constexpr (HAS_WEIGHT) {
            // Reloaded per row rather than held across rows: it stays in L1, and holding it
            // would double the registers a thread needs.
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              result[i] = values[step][i] * scale * get_element<T>(weight_raw[step], i);
            }
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) result[i] = values[step][i] * scale;
          }
          store_floats<T, VEC_BYTES>(out_row + column, result);
        }
      }
    }
  }
}

}  // namespace kiln

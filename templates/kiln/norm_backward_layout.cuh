// What the norm backward kernels (kiln::norm_backward, kiln::norm_backward_rows) derive from
// their template arguments (how a row is split over its threads, and which of the features
// in FEATURES, NormBackwardFeature, both kernels read) and from their parameters.
#pragma once

#include "kiln/norm_backward_params.cuh"

namespace kiln {

template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS, unsigned F>
struct NormBackwardLayout {
  static_assert(VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  static_assert(HIDDEN % kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");
  static_assert(THREADS_PER_ROW <= 32 ? (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0
                                      : THREADS_PER_ROW % 32 == 0,
                "a row's threads are a power of two up to a warp, or whole warps");

  static constexpr int kStride = kVec * THREADS_PER_ROW;
  static constexpr int kSteps = (HIDDEN + kStride - 1) / kStride;
  static constexpr bool kExact = HIDDEN % kStride == 0;
  static constexpr int kWords = VEC_BYTES < 4 ? 1 : VEC_BYTES / 4;
  static constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW;
  static constexpr float kInvHidden = 1.0f / HIDDEN;
  static constexpr bool kLayer = (F & NormBackwardFeature::layer) != 0;
  static constexpr bool kWeight = (F & NormBackwardFeature::weight) != 0;
  static constexpr bool kResidual = (F & NormBackwardFeature::residual) != 0;
  static constexpr bool kModulate = (F & NormBackwardFeature::modulate) != 0;
  static constexpr bool kTable = (F & NormBackwardFeature::table) != 0;
  static constexpr bool kScalePerToken = kModulate && (F & NormBackwardFeature::scale_rows) != 0;
};

// Where row `row`'s scale operand starts: [B, 1 or T, hidden] read through its strides.
template <typename T>
__device__ __forceinline__ const T* norm_backward_scale_row(const NormBackwardParams& p,
                                                            long long row) {
  const long long batch = row / p.tokens;
  return static_cast<const T*>(p.scale) + batch * p.scale_batch_stride +
         (row - batch * p.tokens) * p.scale_token_stride;
}

}  // namespace kiln

// kiln::sum_partials: the last step of a norm backward's parameter gradients. The backward
// kernel writes one fp32 row of sums per item ([segments * items, HIDDEN]); this kernel adds
// each segment's items up and rounds the result once to T. A CTA owns a band of
// COLUMN_THREADS vectors of columns; its CTA_THREADS / COLUMN_THREADS row lanes split the
// items between them (lane l adds items l, l + lanes, ...), and the lanes' sums meet in
// shared memory. torch's sum over the rows of the same buffer and the cast after it took two
// launches and twice the time (BENCHMARKS.md, "Backward of the norm family").
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/norm_backward_params.cuh"

namespace kiln {

template <typename T, int HIDDEN, int VEC_BYTES, int COLUMN_THREADS, int CTA_THREADS>
__global__ void __launch_bounds__(CTA_THREADS) sum_partials(const PartialSumParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(float));
  constexpr int kLanes = CTA_THREADS / COLUMN_THREADS;
  constexpr int kVectors = HIDDEN / kVec;
  static_assert(VEC_BYTES % sizeof(float) == 0 && HIDDEN % kVec == 0, "whole fp32 vectors");
  static_assert(CTA_THREADS % COLUMN_THREADS == 0, "row lanes tile the CTA");
  __shared__ float lane_sums[kLanes][COLUMN_THREADS * kVec];

  const int column = static_cast<int>(threadIdx.x) % COLUMN_THREADS;
  const int lane = static_cast<int>(threadIdx.x) / COLUMN_THREADS;
  const int vector = static_cast<int>(blockIdx.x) * COLUMN_THREADS + column;
  const bool owner = vector < kVectors;
  for (long long s = 0; s < p.segments; ++s) {
    float sum[kVec] = {};
    if (owner) {
      const float* first = p.partial + s * p.items * HIDDEN + static_cast<long long>(vector) * kVec;
#pragma unroll 4
      for (long long item = lane; item < p.items; item += kLanes) {
        const Raw<VEC_BYTES> v = load_global_nc<VEC_BYTES>(first + item * HIDDEN);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum[i] += get_element<float>(v, i);
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) lane_sums[lane][column * kVec + i] = sum[i];
    __syncthreads();
    if (lane == 0 && owner) {
      for (int other = 1; other < kLanes; ++other) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum[i] += lane_sums[other][column * kVec + i];
      }
      T* out = static_cast<T*>(p.out) + s * HIDDEN + static_cast<long long>(vector) * kVec;
      store_floats<T, kVec* static_cast<int>(sizeof(T))>(out, sum);
    }
    __syncthreads();  // the next segment's lanes write lane_sums again
  }
}

}  // namespace kiln

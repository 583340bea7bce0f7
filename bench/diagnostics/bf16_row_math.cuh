// The arithmetic of a bf16 RMSNorm row in 16-byte vectors (8 elements), shared by one_row's
// kernels and norm_ladder's: the sum of squares of a vector, a vector scaled by 1 / rms (and
// the weight), and a warp's and a CTA's sum.
#pragma once

#include <cuda_bf16.h>

namespace bf16_row {

__device__ __forceinline__ float squares(const uint4& v) {
  const auto* e = reinterpret_cast<const __nv_bfloat16*>(&v);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float f = __bfloat162float(e[i]);
    s += f * f;
  }
  return s;
}

__device__ __forceinline__ uint4 scaled(const uint4& v, const uint4& w, float r, bool weight) {
  const auto* e = reinterpret_cast<const __nv_bfloat16*>(&v);
  const auto* we = reinterpret_cast<const __nv_bfloat16*>(&w);
  uint4 o;
  auto* oe = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float f = __bfloat162float(e[i]) * r;
    if (weight) f *= __bfloat162float(we[i]);
    oe[i] = __float2bfloat16(f);
  }
  return o;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum over a CTA of THREADS threads (a multiple of 32): warp sums, then one barrier.
template <int THREADS>
__device__ __forceinline__ float block_sum(float v) {
  v = warp_sum(v);
  if constexpr (THREADS > 32) {
    __shared__ float part[THREADS / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int i = 0; i < THREADS / 32; ++i) v += part[i];
  }
  return v;
}

}  // namespace bf16_row

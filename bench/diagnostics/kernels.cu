// Kernels for flush_alternation.cpp: a one-row-per-CTA RMSNorm (bf16, 256 threads, two 16-byte
// vectors per thread) to time, and two ways to flush L2 besides a memset.
#include <cuda_bf16.h>

extern "C" __global__ void __launch_bounds__(256)
    rms_norm_row(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                 __nv_bfloat16* __restrict__ y, int rows, int hidden, float eps) {
  constexpr int kThreads = 256, kVectors = 2;
  __shared__ float partial[32];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* in = reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * hidden);
    const uint4* weight = reinterpret_cast<const uint4*>(w);
    uint4* out = reinterpret_cast<uint4*>(y + static_cast<size_t>(row) * hidden);
    const int vectors = hidden / 8;
    uint4 v[kVectors];
    float sum = 0;
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
      const int i = threadIdx.x + u * kThreads;
      v[u] = i < vectors ? in[i] : make_uint4(0, 0, 0, 0);
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v[u]);
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += __bfloat162float(e[k]) * __bfloat162float(e[k]);
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
      float t = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0;
      for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(~0u, t, o);
      if (threadIdx.x == 0) partial[0] = t;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / hidden + eps);
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
      const int i = threadIdx.x + u * kThreads;
      if (i >= vectors) continue;
      const uint4 wv = weight[i];
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v[u]);
      const __nv_bfloat16* we = reinterpret_cast<const __nv_bfloat16*>(&wv);
      uint4 result;
      __nv_bfloat16* r = reinterpret_cast<__nv_bfloat16*>(&result);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        r[k] = __float2bfloat16(__bfloat162float(e[k]) * scale * __bfloat162float(we[k]));
      out[i] = result;
    }
    __syncthreads();
  }
}

extern "C" __global__ void flush_by_writing(uint4* buffer, size_t vectors) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    buffer[i] = make_uint4(0, 0, 0, 0);
}

extern "C" __global__ void flush_by_reading(const uint4* buffer, size_t vectors, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = buffer[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if (acc.x == 0x12345678u) *sink = acc;  // keeps the loads
}

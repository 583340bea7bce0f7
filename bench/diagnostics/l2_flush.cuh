// The L2 flush the diagnostics run before every timed call: an L2 evict_last read of the flush
// buffer, then a memset of it. The memset alone (triton's do_bench flush) leaves lines read
// with evict_last and some read plainly, so a call could start partly warm from the call
// before it that read the same buffers (BENCHMARKS.md, "The flush did not clear"); the read
// displaces those, and the memset then leaves L2 dirty as do_bench leaves it. kiln's tuner
// (jit/l2_flush.cpp) flushes the same way, after lowering its candidates' own lines to
// evict_normal: lines that kiln's re-read kernels read with evict_last survived this flush
// there, and the diagnostics' kernels read with evict_first or plainly. The benches
// (bench/common.py) write another buffer than they read, after which torch.compile's kernels run
// 8-10% faster (BENCHMARKS.md, the tuner's ranking probes), kiln's alike.
#pragma once

#include <cuda_runtime.h>

__global__ void l2_flush_read(const uint4* buffer, size_t vectors) {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += stride) {
    unsigned a, b, c, d;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(buffer + i), "l"(policy));
    asm volatile("" ::"r"(a), "r"(b), "r"(c), "r"(d));  // the values are not wanted
  }
}

// Queues the read and the memset of `bytes` at `buffer` on the default stream.
inline cudaError_t flush_l2(void* buffer, size_t bytes) {
  l2_flush_read<<<1056, 256>>>(static_cast<const uint4*>(buffer), bytes / 16);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  return cudaMemsetAsync(buffer, 0, bytes);
}

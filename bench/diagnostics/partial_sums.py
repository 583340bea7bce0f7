"""What adding up a norm backward's fp32 partial rows costs: the [items, D] partials kiln's
norm_backward writes for a weight's (or bias's) gradient, summed over the items and cast to
bf16 (or left in fp32 for an fp32 gradient), timed side by side (bench/common.py's timing)
three ways:
- `sum0`: torch's p.sum(0).to(dtype), what bindings/torch/norm_backward_cuda.cpp did before
  kiln::sum_partials;
- `two_stage`: p.view(16, items / 16, D).sum(1).sum(0).to(bf16);
- `columns`: a plain CUDA kernel (compiled here with torch's load_inline) whose CTAs each own
  a band of columns, split the items among row lanes, add the lanes up in shared memory and
  write the cast result: one launch.

Usage (GPU machine with nvcc): python bench/diagnostics/partial_sums.py [--dtype float32]"""

import argparse

import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402

SOURCE = r"""
#include <torch/extension.h>
#include <cuda_bf16.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ void store(__nv_bfloat16* o, float v) { *o = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* o, float v) { *o = v; }

// CTA: 32 x LANES threads; thread (c, l) owns columns [4 (band * 32 + c), +4) and adds up
// items l, l + LANES, ...; the LANES sums of a column meet in shared memory.
template <int LANES, typename T>
__global__ void column_sums(const float4* __restrict__ partial, T* out, int items, int width4) {
  __shared__ float4 sums[LANES][32];
  const int column = blockIdx.x * 32 + threadIdx.x;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (column < width4) {
#pragma unroll 8
    for (int i = threadIdx.y; i < items; i += LANES) {
      const float4 v = __ldg(partial + static_cast<long long>(i) * width4 + column);
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && column < width4) {
    for (int l = 1; l < LANES; ++l) {
      const float4 v = sums[l][threadIdx.x];
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    T* o = out + 4 * column;
    store(o, acc.x); store(o + 1, acc.y); store(o + 2, acc.z); store(o + 3, acc.w);
  }
}

template <typename T>
void launch(const float4* p, T* o, int items, int width4, int64_t lanes) {
  const dim3 grid((width4 + 31) / 32);
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (lanes == 8) column_sums<8><<<grid, dim3(32, 8), 0, stream>>>(p, o, items, width4);
  else if (lanes == 16) column_sums<16><<<grid, dim3(32, 16), 0, stream>>>(p, o, items, width4);
  else column_sums<32><<<grid, dim3(32, 32), 0, stream>>>(p, o, items, width4);
}

torch::Tensor column_sum(torch::Tensor partial, int64_t lanes, bool fp32) {
  const int items = partial.size(0), width = partial.size(1);
  auto out = torch::empty({width}, partial.options().dtype(fp32 ? torch::kFloat : torch::kBFloat16));
  const int width4 = width / 4;
  auto* p = reinterpret_cast<const float4*>(partial.data_ptr<float>());
  if (fp32) launch(p, out.data_ptr<float>(), items, width4, lanes);
  else launch(p, reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), items, width4, lanes);
  return out;
}
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    dtype = getattr(torch, parser.parse_args().dtype)
    fp32 = dtype == torch.float32
    ext = load_inline("partial_sums_diag",
                      cpp_sources="torch::Tensor column_sum(torch::Tensor, int64_t, bool);",
                      cuda_sources=SOURCE, functions=["column_sum"], verbose=False,
                      extra_cuda_cflags=["-O3"])
    print(f"{str(dtype)}: {'partials':>14}  " + "  ".join(f"{n:>12}" for n in
                                           ("sum0", "two_stage", "cols x8", "cols x16", "cols x32")))
    for items, width in ((256, 8192), (256, 4096), (512, 2048), (256, 14848), (128, 8192)):
        p = torch.randn(items, width, device="cuda")
        expected = p.double().sum(0)
        calls = {
            "sum0": lambda: p.sum(0).to(dtype),
            "two_stage": lambda: p.view(16, items // 16, width).sum(1).sum(0).to(dtype),
            "cols x8": lambda: ext.column_sum(p, 8, fp32),
            "cols x16": lambda: ext.column_sum(p, 16, fp32),
            "cols x32": lambda: ext.column_sum(p, 32, fp32),
        }
        for name, call in calls.items():
            error = ((call().double() - expected).abs() / expected.abs().clamp_min(1.0)).max().item()
            assert error < 1e-2, (name, error)
        times = common.bench_side_by_side(calls)
        print(f"{items:>5} x {width:<6}  " + "  ".join(f"{times[n] * 1e3:9.2f} us" for n in calls),
              flush=True)


if __name__ == "__main__":
    main()

// What reading a cos/sin table costs a RoPE kernel, and how the walk over heads changes it. The
// FLUX-like call of bench/rope.py (q and k [1, 24, 4608, 128] bf16, here one [48, 4608, 128]
// tensor; interleaved pairs; an fp32 table [4608, 128] of cos and one of sin) written a dozen
// ways, beside a device-to-device copy and a negation of the same x (one read and one write, as
// PyTorch's elementwise kernel), each call timed as triton's do_bench times one (a 256 MB
// flush before it, l2_flush.cuh; CUDA events around it), the variants interleaved, median of 280
// calls.
//
// kiln's table-reading RoPE took 1.08-1.13x the time of a negation of the same bytes, whatever
// config its tuner chose; this separates the table's share of that from the kernel's.
// Build and run on a GPU machine: bash bench/diagnostics/run.sh
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "l2_flush.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int kHeads = 48;
constexpr int kPositions = 4608;
constexpr int kDim = 128;
constexpr int kUnits = kDim / 8;  // 16-byte vectors of bf16 per row
constexpr long long kHeadStride = static_cast<long long>(kPositions) * kUnits;  // in vectors

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

__device__ __forceinline__ uint4 load_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float4 load_nc(const float4* p) {
  const uint4 v = load_nc(reinterpret_cast<const uint4*>(p));
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                     __uint_as_float(v.w));
}

// A unit's 8 angles: cos and sin.
struct Angles {
  float c[8];
  float s[8];
};

__device__ __forceinline__ void unpack(float4 a, float4 b, float* to) {
  to[0] = a.x, to[1] = a.y, to[2] = a.z, to[3] = a.w;
  to[4] = b.x, to[5] = b.y, to[6] = b.z, to[7] = b.w;
}

__device__ __forceinline__ Angles fp32_row(const float* cos, const float* sin, int position,
                                           int unit) {
  const auto* c = reinterpret_cast<const float4*>(cos + position * kDim + unit * 8);
  const auto* s = reinterpret_cast<const float4*>(sin + position * kDim + unit * 8);
  Angles a;
  unpack(load_nc(c), load_nc(c + 1), a.c);
  unpack(load_nc(s), load_nc(s + 1), a.s);
  return a;
}

__device__ __forceinline__ uint4 rotate(uint4 x, const Angles& a) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&x);
  uint4 out;
  auto* rotated = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    rotated[i] = __floats2bfloat162_rn(f.x * a.c[2 * i] - f.y * a.s[2 * i],
                                       f.y * a.c[2 * i + 1] + f.x * a.s[2 * i + 1]);
  }
  return out;
}

__global__ void negate(const uint4* x, uint4* out, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint4 v = load_nc(x + i);
  v.x ^= 0x80008000u, v.y ^= 0x80008000u, v.z ^= 0x80008000u, v.w ^= 0x80008000u;
  out[i] = v;
}

// One vector a thread, in memory order (head, position, unit); the angles computed, not read:
// the same work without the table's traffic.
__global__ void computed_angles(const uint4* x, uint4* out) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kHeads * kHeadStride) return;
  const int unit = static_cast<int>(i % kUnits);
  const int position = static_cast<int>(i / kUnits % kPositions);
  Angles a;
#pragma unroll
  for (int k = 0; k < 8; ++k) __sincosf(position * (1.0f + unit * 8 + k) * 1e-3f, &a.s[k], &a.c[k]);
  out[i] = rotate(load_nc(x + i), a);
}

// Memory order; every thread reads position 0's first unit: the table's loads, all L1 hits.
__global__ void one_table_line(const uint4* x, uint4* out, const float* cos, const float* sin) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kHeads * kHeadStride) return;
  out[i] = rotate(load_nc(x + i), fp32_row(cos, sin, 0, 0));
}

// One vector a thread in memory order, as heads_a_thread<1>, with a bf16 table read as 16-byte
// vectors, as x is: half the table bytes.
__global__ void table_bf16(const uint4* x, uint4* out, const float* cos, const float* sin) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kHeads * kHeadStride) return;
  const long long row = i % kHeadStride;  // position * units + unit
  const uint4 c = load_nc(reinterpret_cast<const uint4*>(cos) + row);
  const uint4 s = load_nc(reinterpret_cast<const uint4*>(sin) + row);
  Angles a;
  const auto* c2 = reinterpret_cast<const __nv_bfloat162*>(&c);
  const auto* s2 = reinterpret_cast<const __nv_bfloat162*>(&s);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 fc = __bfloat1622float2(c2[k]);
    const float2 fs = __bfloat1622float2(s2[k]);
    a.c[2 * k] = fc.x, a.c[2 * k + 1] = fc.y, a.s[2 * k] = fs.x, a.s[2 * k + 1] = fs.y;
  }
  out[i] = rotate(load_nc(x + i), a);
}

// R heads of one (position, unit) from `first`, `head_stride` vectors apart, loaded together
// and rotated by the one Angles that `angles()` gives once their loads are issued.
template <int R, typename AnglesOf>
__device__ __forceinline__ void rotate_heads(const uint4* x, uint4* out, long long first,
                                             long long head_stride, AnglesOf angles) {
  uint4 v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = load_nc(x + first + r * head_stride);
  const Angles a = angles();
#pragma unroll
  for (int r = 0; r < R; ++r) out[first + r * head_stride] = rotate(v[r], a);
}

// R consecutive heads a thread, threads in (head group, position, unit) order, heads
// `head_stride` vectors apart: kiln's rows_per_thread = R, positions inner. With R = 1, memory
// order, and each head re-reads the whole table from L2 (64 bytes of table a 16-byte vector).
template <int R>
__global__ void heads_a_thread(const uint4* x, uint4* out, const float* cos, const float* sin,
                               long long head_stride) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kHeads / R * kHeadStride) return;
  const int unit = static_cast<int>(i % kUnits);
  const int position = static_cast<int>(i / kUnits % kPositions);
  const long long first = i / kHeadStride * R * head_stride + position * kUnits + unit;
  rotate_heads<R>(x, out, first, head_stride, [&] { return fp32_row(cos, sin, position, unit); });
}

// R heads a thread, threads in (position, head group, unit) order: a CTA's rows are heads of
// one position, whose table row L1 can serve. kiln's walk of [B, S, H, D] data.
template <int R>
__global__ void heads_inner(const uint4* x, uint4* out, const float* cos, const float* sin) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kHeads / R * kHeadStride) return;
  const int unit = static_cast<int>(i % kUnits);
  const int group = static_cast<int>(i / kUnits % (kHeads / R));
  const int position = static_cast<int>(i / (kUnits * (kHeads / R)));
  const long long first =
      static_cast<long long>(group) * R * kHeadStride + position * kUnits + unit;
  rotate_heads<R>(x, out, first, kHeadStride, [&] { return fp32_row(cos, sin, position, unit); });
}

// The table rows of `P` positions from `first`, copied into shared memory by the whole CTA in
// coalesced 16-byte loads; then a thread's unit read from there.
template <int P>
__device__ __forceinline__ Angles staged_row(const float* cos, const float* sin, int first,
                                             int slot, int unit, float* shared) {
  for (int k = static_cast<int>(threadIdx.x); k < P * kDim / 4; k += static_cast<int>(blockDim.x)) {
    reinterpret_cast<float4*>(shared)[k] =
        load_nc(reinterpret_cast<const float4*>(cos + first * kDim) + k);
    reinterpret_cast<float4*>(shared + P * kDim)[k] =
        load_nc(reinterpret_cast<const float4*>(sin + first * kDim) + k);
  }
  __syncthreads();
  const auto* c = reinterpret_cast<const float4*>(shared + slot * kDim + unit * 8);
  const auto* s = reinterpret_cast<const float4*>(shared + P * kDim + slot * kDim + unit * 8);
  Angles a;
  unpack(c[0], c[1], a.c);
  unpack(s[0], s[1], a.s);
  return a;
}

// A CTA of 256 threads is 16 heads of one position, the position's table row staged once.
__global__ void heads_inner_staged(const uint4* x, uint4* out, const float* cos, const float* sin) {
  __shared__ __align__(16) float shared[2 * kDim];
  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  const int unit = static_cast<int>(i % kUnits);
  const int head = static_cast<int>(i / kUnits % kHeads);
  const int position = static_cast<int>(i / (kUnits * kHeads));
  const long long at = head * kHeadStride + position * kUnits + unit;
  rotate_heads<1>(x, out, at, kHeadStride,
                  [&] { return staged_row<1>(cos, sin, position, 0, unit, shared); });
}

// A CTA of 128 threads is 8 positions, 4 heads a thread, the 8 table rows staged once.
__global__ void four_heads_staged(const uint4* x, uint4* out, const float* cos, const float* sin) {
  __shared__ __align__(16) float shared[2 * 8 * kDim];
  const long long i = static_cast<long long>(blockIdx.x) * 128 + threadIdx.x;
  const int unit = static_cast<int>(i % kUnits);
  const int position = static_cast<int>(i / kUnits % kPositions);
  const long long first = i / kHeadStride * 4 * kHeadStride + position * kUnits + unit;
  const int slot = static_cast<int>(threadIdx.x) / kUnits;
  rotate_heads<4>(x, out, first, kHeadStride,
                  [&] { return staged_row<8>(cos, sin, position - slot, slot, unit, shared); });
}

unsigned covering(long long work, int threads) {
  return static_cast<unsigned>((work + threads - 1) / threads);
}

}  // namespace

int main() {
  const long long vectors = kHeads * kHeadStride;
  const size_t bytes = static_cast<size_t>(vectors) * 16;
  const size_t padded_bytes = bytes + kHeads * 4096;  // room for a padded head stride
  const size_t table_bytes = size_t{kPositions} * kDim * 4;
  const size_t flush_bytes = size_t{256} << 20;
  void *flush, *x_buffer, *out_buffer, *cos_buffer, *sin_buffer;
  check(cudaMalloc(&flush, flush_bytes), "cudaMalloc");
  check(cudaMalloc(&x_buffer, padded_bytes), "cudaMalloc");
  check(cudaMalloc(&out_buffer, padded_bytes), "cudaMalloc");
  check(cudaMalloc(&cos_buffer, table_bytes), "cudaMalloc");
  check(cudaMalloc(&sin_buffer, table_bytes), "cudaMalloc");
  check(cudaMemset(x_buffer, 0x3f, padded_bytes), "cudaMemset");
  check(cudaMemset(cos_buffer, 0x3f, table_bytes), "cudaMemset");
  check(cudaMemset(sin_buffer, 0x3e, table_bytes), "cudaMemset");
  const auto* x = static_cast<const uint4*>(x_buffer);
  auto* out = static_cast<uint4*>(out_buffer);
  const auto* cos = static_cast<const float*>(cos_buffer);
  const auto* sin = static_cast<const float*>(sin_buffer);

  struct Variant {
    std::string name;
    std::function<void()> launch;
    bool rotates;  // computes RoPE with the table: its output must equal the 1-head fp32 kernel's
  };
  const std::vector<Variant> variants = {
      {"memcpy of x", [&] { cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice); }, false},
      {"negate x (the floor)", [&] { negate<<<covering(vectors, 256), 256>>>(x, out, vectors); },
       false},
      {"angles computed, no table",
       [&] { computed_angles<<<covering(vectors, 256), 256>>>(x, out); }, false},
      {"table, one line for all (L1)",
       [&] { one_table_line<<<covering(vectors, 256), 256>>>(x, out, cos, sin); }, false},
      {"fp32 table, 1 head a thread",
       [&] { heads_a_thread<1><<<covering(vectors, 256), 256>>>(x, out, cos, sin, kHeadStride); },
       true},
      {"bf16 table, 1 head a thread",
       [&] { table_bf16<<<covering(vectors, 256), 256>>>(x, out, cos, sin); }, false},
      {"fp32 table, 2 heads a thread",
       [&] {
         heads_a_thread<2><<<covering(vectors / 2, 128), 128>>>(x, out, cos, sin, kHeadStride);
       },
       true},
      {"fp32 table, 4 heads a thread",
       [&] {
         heads_a_thread<4><<<covering(vectors / 4, 128), 128>>>(x, out, cos, sin, kHeadStride);
       },
       true},
      {"fp32 table, 8 heads a thread",
       [&] {
         heads_a_thread<8><<<covering(vectors / 8, 128), 128>>>(x, out, cos, sin, kHeadStride);
       },
       true},
      {"  4 heads, head stride +4 KB",
       [&] {
         heads_a_thread<4>
             <<<covering(vectors / 4, 128), 128>>>(x, out, cos, sin, kHeadStride + 256);
       },
       false},
      {"fp32 table, heads inner, 1 a thread",
       [&] { heads_inner<1><<<covering(vectors, 256), 256>>>(x, out, cos, sin); }, true},
      {"fp32 table, heads inner, 4 a thread",
       [&] { heads_inner<4><<<covering(vectors / 4, 128), 128>>>(x, out, cos, sin); }, true},
      {"  heads inner, table row staged",
       [&] { heads_inner_staged<<<covering(vectors, 256), 256>>>(x, out, cos, sin); }, true},
      {"  4 heads, 8 table rows staged",
       [&] { four_heads_staged<<<covering(vectors / 4, 128), 128>>>(x, out, cos, sin); }, true},
  };

  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<std::vector<float>> times(variants.size());
  for (int call = 0; call < 300; ++call) {
    for (size_t k = 0; k < variants.size(); ++k) {
      const size_t v = (k + static_cast<size_t>(call)) % variants.size();  // rotate the order
      check(flush_l2(flush, flush_bytes), "flush_l2");
      check(cudaEventRecord(start), "cudaEventRecord");
      variants[v].launch();
      check(cudaEventRecord(stop), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (call >= 20) times[v].push_back(ms * 1000);
    }
  }
  check(cudaGetLastError(), "a launch");
  std::printf("x %.1f MB read and written, table %.1f MB: %.1f MB moved\n", bytes / 1e6,
              2 * table_bytes / 1e6, (2.0 * bytes + 2.0 * table_bytes) / 1e6);
  std::printf("%-38s %9s %12s\n", "us (median of 280)", "us", "/ negate");
  float floor_us = 0;
  for (size_t k = 0; k < variants.size(); ++k) {
    std::vector<float>& t = times[k];
    std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
    const float median = t[t.size() / 2];
    if (k == 1) floor_us = median;
    std::printf("%-38s %9.2f %12.3f\n", variants[k].name.c_str(), median,
                floor_us > 0 ? median / floor_us : 0.0f);
  }

  // Every variant that rotates with the fp32 table must write what the 1-head kernel writes.
  std::vector<unsigned short> host_x(bytes / 2);
  for (size_t k = 0; k < host_x.size(); ++k) {
    host_x[k] = static_cast<unsigned short>(0x3f00 + (k * 2654435761u >> 20) % 255);
  }
  std::vector<float> host_table(table_bytes / 4);
  for (size_t k = 0; k < host_table.size(); ++k) host_table[k] = 0.001f * (k % 977);
  check(cudaMemcpy(x_buffer, host_x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(cos_buffer, host_table.data(), table_bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  for (float& f : host_table) f = 1.0f - f;
  check(cudaMemcpy(sin_buffer, host_table.data(), table_bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  std::vector<unsigned> expected(bytes / 4), got(bytes / 4);
  heads_a_thread<1><<<covering(vectors, 256), 256>>>(x, out, cos, sin, kHeadStride);
  check(cudaMemcpy(expected.data(), out_buffer, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  long differing = 0;
  for (const Variant& variant : variants) {
    if (!variant.rotates) continue;
    check(cudaMemset(out_buffer, 0xff, bytes), "cudaMemset");
    variant.launch();
    check(cudaMemcpy(got.data(), out_buffer, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t k = 0; k < got.size(); ++k) differing += got[k] != expected[k];
  }
  std::printf("words differing from the 1-head fp32 kernel's output: %ld\n", differing);
  return differing == 0 ? 0 : 1;
}

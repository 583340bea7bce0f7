// A ladder from a minimal RMSNorm kernel towards kiln's, one step of kiln's structure at a
// time, to find which step costs a launch-bound call (1 or 128 rows). Each kernel normalises
// 4096-wide bf16 rows with a weight, one row a CTA, takes kiln::NormPlainArgs as kiln's
// kernels do, and is built to PTX and timed by one_row beside kiln's own (run.sh):
//
//   base       the row's address from blockIdx.x and the compile-time width, no row count
//   unchecked  + the addresses from the row strides in the parameters (64-bit multiplies)
//   checked    base + a CTA past the row count returns before loading
//   strided    unchecked + checked: what every kiln row does
//   clamped    strided, but a CTA past the row count loads the last row and stores nothing
//              (no branch before the loads)
//   looped     base inside a grid-stride loop over rows, as kiln's kernel runs (with the
//              second barrier a loop needs before the buffer is written again)
//   barrier2   base + a second barrier after the block sum (kiln's group_sum has two)
//
// All wait for the prior grid and let the next one launch first, as kiln's kernels do.
#include "bf16_row_math.cuh"
#include "kiln/norm_params.cuh"  // templates/ on the include path

namespace {

constexpr int kHidden = 4096;
constexpr int kVectors = kHidden / 8;

enum Step { kBase, kUnchecked, kChecked, kStrided, kClamped, kLooped, kBarrier2 };

using bf16_row::block_sum;
using bf16_row::scaled;
using bf16_row::squares;

template <int THREADS, Step STEP>
__device__ __forceinline__ void normalise_row(const kiln::NormPlainArgs& p, long long row,
                                              bool store) {
  constexpr int kSteps = kVectors / THREADS;
  constexpr bool kStrides = STEP == kUnchecked || STEP == kStrided || STEP == kClamped;
  const uint4* x;
  uint4* out;
  if constexpr (kStrides) {
    x = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.x) +
                                       row * p.x_row_stride);
    out = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + row * p.out_row_stride);
  } else {
    x = static_cast<const uint4*>(p.x) + row * kVectors;
    out = static_cast<uint4*>(p.out) + row * kVectors;
  }
  const auto* w = static_cast<const uint4*>(p.weight);
  uint4 v[kSteps];
  uint4 wv[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    v[s] = __ldg(x + threadIdx.x + s * THREADS);
    wv[s] = __ldg(w + threadIdx.x + s * THREADS);
  }
  float ss = 0.0f;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) ss += squares(v[s]);
  ss = block_sum<THREADS>(ss);
  if constexpr (STEP == kBarrier2 || STEP == kLooped) __syncthreads();
  const float r = rsqrtf(ss * (1.0f / kHidden) + p.eps);
  if (!store) return;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) out[threadIdx.x + s * THREADS] = scaled(v[s], wv[s], r, true);
}

template <int THREADS, Step STEP>
__device__ __forceinline__ void ladder(const kiln::NormPlainArgs& p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const long long row = blockIdx.x;
  if constexpr (STEP == kLooped) {
    for (long long r = row; r < p.rows; r += gridDim.x) normalise_row<THREADS, STEP>(p, r, true);
  } else if constexpr (STEP == kClamped) {
    const bool inside = row < p.rows;
    normalise_row<THREADS, STEP>(p, inside ? row : p.rows - 1, inside);
  } else {
    if constexpr (STEP == kChecked || STEP == kStrided) {
      if (row >= p.rows) return;
    }
    normalise_row<THREADS, STEP>(p, row, true);
  }
}

}  // namespace

#define KILN_LADDER(name, step)                                                              \
  extern "C" __global__ void __launch_bounds__(512) name##512(const kiln::NormPlainArgs p) { \
    ladder<512, step>(p);                                                                    \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(256) name##256(const kiln::NormPlainArgs p) { \
    ladder<256, step>(p);                                                                    \
  }

KILN_LADDER(base, kBase)
KILN_LADDER(unchecked, kUnchecked)
KILN_LADDER(checked, kChecked)
KILN_LADDER(strided, kStrided)
KILN_LADDER(clamped, kClamped)
KILN_LADDER(looped, kLooped)
KILN_LADDER(barrier2, kBarrier2)

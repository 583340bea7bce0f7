// Device helpers shared by every kiln kernel template.
//
// NVRTC compiles these with no CUDA toolkit header at all (NVRTC 13 ships no built-in
// cuda_fp16.h / cuda_bf16.h), so the 16-bit float types, their conversions and the vector
// memory accesses are kiln's own, written with inline PTX. Only NVRTC built-ins are used.
#pragma once

namespace kiln {

// Storage-only 16-bit floats: all arithmetic happens in fp32 after to_float().
struct f16 {
  unsigned short bits;
};
struct bf16 {
  unsigned short bits;
};

// ---------------------------------------------------------------------------------------
// Conversions. Narrowing rounds to nearest even, as torch's .to(dtype) does.

__device__ __forceinline__ float to_float(float value) {
  return value;
}

__device__ __forceinline__ float to_float(f16 value) {
  float result;
  asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(value.bits));
  return result;
}

// bf16 is the upper half of an fp32, so widening is exact and needs no instruction.
__device__ __forceinline__ float to_float(bf16 value) {
  return __uint_as_float(static_cast<unsigned>(value.bits) << 16);
}

template <typename T>
__device__ __forceinline__ T from_float(float value);

template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}

template <>
__device__ __forceinline__ f16 from_float<f16>(float value) {
  f16 result;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(result.bits) : "f"(value));
  return result;
}

template <>
__device__ __forceinline__ bf16 from_float<bf16>(float value) {
  bf16 result;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(result.bits) : "f"(value));
#else
  // No bf16 conversion instruction before sm_80: round the fp32 bits to nearest even by
  // hand. A NaN must stay a NaN, which the rounding add could turn into an infinity.
  const unsigned bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    result.bits = static_cast<unsigned short>((bits >> 16) | 0x0040u);
  } else {
    const unsigned rounding = 0x7fffu + ((bits >> 16) & 1u);
    result.bits = static_cast<unsigned short>((bits + rounding) >> 16);
  }
#endif
  return result;
}

// 2^x from the hardware's ex2.approx.ftz (relative error ~2^-22): a result below 2^-126
// flushes to 0. exp2f adds a compare and two scalings to keep such results; callers whose
// results are normal, or whose use absorbs a flushed one, have no need of them.
__device__ __forceinline__ float exp2_flushed(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

// e^x as ex2.approx.ftz: a result below 2^-126 flushes to 0, which the 1 + e^x it feeds
// absorbs anyway (2^-126 is far below half an ulp of 1), while __expf's non-flushing form
// spends a compare and two scalings on it per element.
__device__ __forceinline__ float exp_flushed(float x) {
  return exp2_flushed(x * 1.4426950408889634f);
}

// x * sigmoid(z) (the activations' and the gated norm's), written x / (1 + exp(-z)), which is
// exact in both limits (exp overflowing to inf gives -0 or 0, as the true value rounds to).
__device__ __forceinline__ float times_sigmoid(float x, float z) {
  return __fdividef(x, 1.0f + exp_flushed(-z));
}

// Two fp32 values rounded to T and widened back, as storing them and reading them back would.
template <typename T>
__device__ __forceinline__ void round_through(float& a, float& b) {
  a = to_float(from_float<T>(a));
  b = to_float(from_float<T>(b));
}

// On sm_80 and later a bf16 pair rounds in one packed conversion (the same rounding).
template <>
__device__ __forceinline__ void round_through<bf16>(float& a, float& b) {
#if __CUDA_ARCH__ >= 800
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(b), "f"(a));
  a = __uint_as_float(packed << 16);
  b = __uint_as_float(packed & 0xffff0000u);
#else
  a = to_float(from_float<bf16>(a));
  b = to_float(from_float<bf16>(b));
#endif
}

// ---------------------------------------------------------------------------------------
// Raw vectors: BYTES bytes held in 32-bit registers (a 2-byte vector uses the low half of
// one register). Elements are extracted with shifts at compile-time positions, so a
// vector never needs an addressable (local memory) copy.

template <int BYTES>
struct Raw {
  static_assert(BYTES == 2 || BYTES == 4 || BYTES == 8 || BYTES == 16,
                "vector width must be 2, 4, 8 or 16 bytes");
  unsigned words[BYTES < 4 ? 1 : BYTES / 4];
};

// Global loads of read-only data go through the non-coherent (texture) path: valid only
// for buffers the kernel never writes. The asm is volatile so the compiler never hoists a
// load above the bounds check that guards it (an asm without side effects may be
// speculated); ptxas still schedules the loads freely.
template <int BYTES>
__device__ __forceinline__ Raw<BYTES> load_global_nc(const void* address);

template <>
__device__ __forceinline__ Raw<16> load_global_nc<16>(const void* address) {
  Raw<16> r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.words[0]), "=r"(r.words[1]), "=r"(r.words[2]), "=r"(r.words[3])
               : "l"(address));
  return r;
}

template <>
__device__ __forceinline__ Raw<8> load_global_nc<8>(const void* address) {
  Raw<8> r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];"
               : "=r"(r.words[0]), "=r"(r.words[1])
               : "l"(address));
  return r;
}

template <>
__device__ __forceinline__ Raw<4> load_global_nc<4>(const void* address) {
  Raw<4> r;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(r.words[0]) : "l"(address));
  return r;
}

template <>
__device__ __forceinline__ Raw<2> load_global_nc<2>(const void* address) {
  unsigned short half;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(half) : "l"(address));
  Raw<2> r;
  r.words[0] = half;
  return r;
}

// Coherent loads, for inputs the same kernel may also write (in-place residual updates).
template <int BYTES>
__device__ __forceinline__ Raw<BYTES> load_global(const void* address);

template <>
__device__ __forceinline__ Raw<16> load_global<16>(const void* address) {
  Raw<16> r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.words[0]), "=r"(r.words[1]), "=r"(r.words[2]), "=r"(r.words[3])
               : "l"(address)
               : "memory");
  return r;
}

template <>
__device__ __forceinline__ Raw<8> load_global<8>(const void* address) {
  Raw<8> r;
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];"
               : "=r"(r.words[0]), "=r"(r.words[1])
               : "l"(address)
               : "memory");
  return r;
}

template <>
__device__ __forceinline__ Raw<4> load_global<4>(const void* address) {
  Raw<4> r;
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(r.words[0]) : "l"(address) : "memory");
  return r;
}

template <>
__device__ __forceinline__ Raw<2> load_global<2>(const void* address) {
  unsigned short half;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(half) : "l"(address) : "memory");
  Raw<2> r;
  r.words[0] = half;
  return r;
}

template <int BYTES>
__device__ __forceinline__ void store_global(void* address, const Raw<BYTES>& r);

template <>
__device__ __forceinline__ void store_global<16>(void* address, const Raw<16>& r) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(r.words[0]),
               "r"(r.words[1]), "r"(r.words[2]), "r"(r.words[3])
               : "memory");
}

template <>
__device__ __forceinline__ void store_global<8>(void* address, const Raw<8>& r) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(address), "r"(r.words[0]), "r"(r.words[1])
               : "memory");
}

template <>
__device__ __forceinline__ void store_global<4>(void* address, const Raw<4>& r) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(address), "r"(r.words[0]) : "memory");
}

template <>
__device__ __forceinline__ void store_global<2>(void* address, const Raw<2>& r) {
  const unsigned short half = static_cast<unsigned short>(r.words[0]);
  asm volatile("st.global.u16 [%0], %1;" ::"l"(address), "h"(half) : "memory");
}

// ---------------------------------------------------------------------------------------
// Element access inside a raw vector. `index` must be a compile-time constant after
// unrolling, or the words array would be spilled to local memory.

template <typename T>
struct ElementBits;
template <>
struct ElementBits<float> {
  __device__ __forceinline__ static float widen(unsigned bits) { return __uint_as_float(bits); }
  __device__ __forceinline__ static unsigned narrow(float value) { return __float_as_uint(value); }
};
template <>
struct ElementBits<f16> {
  __device__ __forceinline__ static float widen(unsigned bits) {
    return to_float(f16{static_cast<unsigned short>(bits)});
  }
  __device__ __forceinline__ static unsigned narrow(float value) {
    return from_float<f16>(value).bits;
  }
};
template <>
struct ElementBits<bf16> {
  __device__ __forceinline__ static float widen(unsigned bits) {
    return to_float(bf16{static_cast<unsigned short>(bits)});
  }
  __device__ __forceinline__ static unsigned narrow(float value) {
    return from_float<bf16>(value).bits;
  }
};

template <typename T, int BYTES>
__device__ __forceinline__ float get_element(const Raw<BYTES>& r, int index) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "elements are 2 or 4 bytes");
  if constexpr (sizeof(T) == 4) {
    return ElementBits<T>::widen(r.words[index]);
  } else {
    return ElementBits<T>::widen((r.words[index / 2] >> (16 * (index % 2))) & 0xffffu);
  }
}

template <typename T, int BYTES>
__device__ __forceinline__ void set_element(Raw<BYTES>& r, int index, float value) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "elements are 2 or 4 bytes");
  const unsigned bits = ElementBits<T>::narrow(value);
  if constexpr (sizeof(T) == 4) {
    r.words[index] = bits;
  } else if (index % 2 == 0) {
    r.words[index / 2] = (r.words[index / 2] & 0xffff0000u) | bits;
  } else {
    r.words[index / 2] = (r.words[index / 2] & 0x0000ffffu) | (bits << 16);
  }
}

// VEC_BYTES / sizeof(T) consecutive elements of `source`, widened to fp32.
template <typename T, int VEC_BYTES>
__device__ __forceinline__ void load_floats_nc(const T* source, float* values) {
  const Raw<VEC_BYTES> r = load_global_nc<VEC_BYTES>(source);
#pragma unroll
  for (int i = 0; i < VEC_BYTES / static_cast<int>(sizeof(T)); ++i) {
    values[i] = get_element<T>(r, i);
  }
}

template <typename T, int VEC_BYTES>
__device__ __forceinline__ void load_floats(const T* source, float* values) {
  const Raw<VEC_BYTES> r = load_global<VEC_BYTES>(source);
#pragma unroll
  for (int i = 0; i < VEC_BYTES / static_cast<int>(sizeof(T)); ++i) {
    values[i] = get_element<T>(r, i);
  }
}

// Rounds VEC_BYTES / sizeof(T) fp32 values to T once each and stores them as one vector.
template <typename T, int VEC_BYTES>
__device__ __forceinline__ void store_floats(T* destination, const float* values) {
  Raw<VEC_BYTES> r;
#pragma unroll
  for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) {
    r.words[w] = 0;
  }
#pragma unroll
  for (int i = 0; i < VEC_BYTES / static_cast<int>(sizeof(T)); ++i) {
    set_element<T>(r, i, values[i]);
  }
  store_global<VEC_BYTES>(destination, r);
}

// ---------------------------------------------------------------------------------------
// Reductions.

// Sum over aligned groups of WIDTH lanes (a power of two <= 32); every lane of the warp
// must call it, and every lane of a group gets the group's sum.
template <int WIDTH = 32>
__device__ __forceinline__ float warp_sum(float value) {
  static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0,
                "warp_sum width must be a power of two <= 32");
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over aligned groups of GROUP_THREADS consecutive threads of a CTA of CTA_THREADS:
// a power of two up to a warp, or any whole number of warps (so a row of 1856 vectors can
// be split exactly over 928 threads). Groups wider than a warp combine per-warp sums
// through shared memory, so every thread of the CTA must call it (it has __syncthreads).
template <int GROUP_THREADS, int CTA_THREADS>
__device__ __forceinline__ float group_sum(float value) {
  static_assert(
      GROUP_THREADS <= 32 ? (GROUP_THREADS & (GROUP_THREADS - 1)) == 0 : GROUP_THREADS % 32 == 0,
      "a group is a power of two up to a warp, or whole warps");
  static_assert(CTA_THREADS % GROUP_THREADS == 0, "groups must tile the CTA");
  if constexpr (GROUP_THREADS <= 32) {
    return warp_sum<GROUP_THREADS>(value);
  } else {
    constexpr int kWarpsPerGroup = GROUP_THREADS / 32;
    __shared__ float warp_sums[CTA_THREADS / 32];
    const int warp = static_cast<int>(threadIdx.x / 32);
    value = warp_sum<32>(value);
    if (threadIdx.x % 32 == 0) {
      warp_sums[warp] = value;
    }
    __syncthreads();
    const int first = warp - warp % kWarpsPerGroup;
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarpsPerGroup; ++i) {
      total += warp_sums[first + i];
    }
    // The next call reuses warp_sums: nobody may overwrite it before everyone has read it.
    __syncthreads();
    return total;
  }
}

// One warp's N partial sums, aligned so that they are stored and loaded as one vector where
// N allows (two or four floats).
template <int N>
struct alignas(N % 4 == 0 ? 16 : (N % 2 == 0 ? 8 : 4)) WarpSums {
  float value[N];
};

// group_sum of N values at once, with one barrier instead of two per value: each warp's N
// sums travel together, and a CTA alternates between two buffers by `parity` (flipped by the
// caller on every call), so a buffer is written again only two calls later, past the barrier
// of the call in between, which no thread reaches before it has read the buffer.
template <int GROUP_THREADS, int CTA_THREADS, int N>
__device__ __forceinline__ void group_sums(float (&values)[N], int parity) {
  static_assert(
      GROUP_THREADS <= 32 ? (GROUP_THREADS & (GROUP_THREADS - 1)) == 0 : GROUP_THREADS % 32 == 0,
      "a group is a power of two up to a warp, or whole warps");
  static_assert(CTA_THREADS % GROUP_THREADS == 0, "groups must tile the CTA");
  if constexpr (GROUP_THREADS <= 32) {
#pragma unroll
    for (int j = 0; j < N; ++j) values[j] = warp_sum<GROUP_THREADS>(values[j]);
  } else {
    constexpr int kWarps = CTA_THREADS / 32;
    constexpr int kWarpsPerGroup = GROUP_THREADS / 32;
    __shared__ WarpSums<N> warp_sums[2][kWarps];
    const int warp = static_cast<int>(threadIdx.x / 32);
    WarpSums<N> mine;
#pragma unroll
    for (int j = 0; j < N; ++j) mine.value[j] = warp_sum<32>(values[j]);
    if (threadIdx.x % 32 == 0) warp_sums[parity][warp] = mine;
    __syncthreads();
    const int first = warp - warp % kWarpsPerGroup;
#pragma unroll
    for (int j = 0; j < N; ++j) values[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarpsPerGroup; ++i) {
      const WarpSums<N> sums = warp_sums[parity][first + i];
#pragma unroll
      for (int j = 0; j < N; ++j) values[j] += sums.value[j];
    }
  }
}

}  // namespace kiln

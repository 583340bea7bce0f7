// Division by a divisor fixed for a whole launch (gated_residual's rows per sample), done as a
// multiply-high and two shifts (Granlund and Montgomery, "Division by invariant integers
// using multiplication", 1994, figure 4.1). A 64-bit division by a run-time value is a
// subroutine of some 30-60 dependent instructions on the GPU (a float reciprocal and
// corrections); at 1-128 tokens a thread divides once and then waits on its loads, so that
// chain sits on the critical path before the first load is issued.
//
// Plain data and plain code, no include: NVRTC compiles it into the kernels, and host code
// (which computes the magic once per call with make_divisor) and the tests compile the same
// quotient().
#pragma once

namespace kiln {

// Exact for every 64-bit numerator and every divisor >= 1, with a 32-bit magic of its own for
// 32-bit numerators.
struct Divisor {
  unsigned long long magic;   // floor(2^64 (2^l - d) / d) + 1, l = ceil(log2 d)
  unsigned int pre_shift;     // min(l, 1)
  unsigned int post_shift;    // max(l - 1, 0)
  unsigned int magic32;       // floor(2^32 (2^l - d) / d) + 1 for l <= 32; 0 above
  unsigned int post_shift32;  // max(min(l, 32) - 1, 0): a quotient of 0 above 2^32
};

// Device code in the kernels, inline host code for make_divisor's callers and the tests.
#ifdef __CUDACC_RTC__
#define KILN_DIVISOR_FUNCTION __device__ __forceinline__
#else
#define KILN_DIVISOR_FUNCTION inline
#endif

KILN_DIVISOR_FUNCTION unsigned long long multiply_high(unsigned long long a, unsigned long long b) {
#ifdef __CUDACC_RTC__
  return __umul64hi(a, b);
#else
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

KILN_DIVISOR_FUNCTION unsigned long long quotient(unsigned long long n, const Divisor& d) {
  const unsigned long long high = multiply_high(n, d.magic);
  return (high + ((n - high) >> d.pre_shift)) >> d.post_shift;
}

// The same quotient for a numerator below 2^32, the same figure with N = 32: one 32-bit
// multiply-high and 32-bit adds and shifts (the 64-bit magic's high word costs a thread four
// multiplies and 64-bit shifts). A divisor above 2^32 has magic32 0 and post_shift32 31, so
// the sum, at most n / 2, shifts to 0.
KILN_DIVISOR_FUNCTION unsigned int quotient(unsigned int n, const Divisor& d) {
#ifdef __CUDACC_RTC__
  const unsigned int high = __umulhi(n, d.magic32);
#else
  const auto high =
      static_cast<unsigned int>((static_cast<unsigned long long>(n) * d.magic32) >> 32);
#endif
  return (high + ((n - high) >> d.pre_shift)) >> d.post_shift32;
}

#undef KILN_DIVISOR_FUNCTION

#ifndef __CUDACC_RTC__
// The magic of d (a divisor below 1 is taken as 1).
inline Divisor make_divisor(unsigned long long d) {
  if (d < 1) d = 1;
  unsigned int l = 0;
  while (l < 64 && (1ull << l) < d) ++l;
  // 2^l - d, which is below d, computed modulo 2^64 (l may be 64).
  const unsigned long long excess = (l == 64 ? 0ull : (1ull << l)) - d;
  Divisor result{};
  result.magic =
      static_cast<unsigned long long>((static_cast<unsigned __int128>(excess) << 64) / d) + 1;
  result.pre_shift = l < 1 ? l : 1;
  result.post_shift = l > 1 ? l - 1 : 0;
  if (l <= 32) {
    const unsigned long long excess32 = (1ull << l) - d;
    result.magic32 = static_cast<unsigned int>((excess32 << 32) / d + 1);
  }
  result.post_shift32 = l > 1 ? (l < 32 ? l : 32) - 1 : 0;
  return result;
}
#endif

}  // namespace kiln

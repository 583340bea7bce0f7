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

// Exact for every 64-bit numerator and every divisor >= 1 (and so for 32-bit ones too).
struct Divisor {
  unsigned long long magic;  // floor(2^64 (2^l - d) / d) + 1, l = ceil(log2 d)
  unsigned int pre_shift;    // min(l, 1)
  unsigned int post_shift;   // max(l - 1, 0)
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

// The same quotient for a numerator below 2^32, without the 64-bit multiply-high (which the
// GPU builds from four 32-bit multiplies): n's high word is zero, so two widening multiplies
// by the magic's halves give the same product's high word.
KILN_DIVISOR_FUNCTION unsigned int quotient(unsigned int n, const Divisor& d) {
  const unsigned long long low =
      static_cast<unsigned long long>(n) * static_cast<unsigned int>(d.magic);
  const unsigned long long middle =
      static_cast<unsigned long long>(n) * static_cast<unsigned int>(d.magic >> 32);
  const auto high = static_cast<unsigned int>((middle + (low >> 32)) >> 32);
  // post_shift reaches 63 for divisors above 2^63: shifted as 64 bits, it stays defined.
  const unsigned long long sum = high + ((n - high) >> d.pre_shift);
  return static_cast<unsigned int>(sum >> d.post_shift);
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
  return result;
}
#endif

}  // namespace kiln

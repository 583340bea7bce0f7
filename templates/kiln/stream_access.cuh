// Global accesses of row streams, data each kernel reads or writes once. A stream read once
// with no L2 priority is a plain read-only load (load_global_nc). It used to skip L1
// (L1::no_allocate) to keep L1 for the per-column operands; on an H200 that made the norms'
// held rows 3-5% slower (adaln 8192 x 8192 bf16: 137.5 vs 131.3 us, torch.compile 130.0;
// gated_adaln 8192 x 4544: 133.8 vs 127.8), while the coherent form with it was as slow and
// the forms without it (coherent or not) as fast. On sm_80 and later an access can also
// carry an L2 eviction priority: a row a kernel reads twice
// (the norms' re-read form) is kept between its passes by reading it evict_last the
// first time and evict_first the second, while streams read once leave first. A read-only
// access asks the same of L1, where a CTA's row of a few KB stays until its second pass:
// rms_norm 32768 x 8192 bf16 re-read on an H200 ran 252.7 us with the L1 priorities and
// 257.4 without (torch.compile's 252.4, which reads the same way). Earlier archs take the
// same accesses without the priorities.
#pragma once

#include "kiln/common.cuh"

namespace kiln {

enum class L2Priority { evict_first, evict_last };

#if __CUDA_ARCH__ >= 800
// A cache policy that applies `P` to every line an access touches.
template <L2Priority P>
__device__ __forceinline__ unsigned long long l2_policy() {
  unsigned long long policy;
  if constexpr (P == L2Priority::evict_last) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

// The access strings: "ld.global" + QUALIFIERS + ".L2::cache_hint" + the vector shape.
#define KILN_HINTED_LOAD(QUALIFIERS)                                                         \
  if constexpr (BYTES == 16) {                                                               \
    asm volatile("ld.global" QUALIFIERS ".L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" \
                 : "=r"(r.words[0]), "=r"(r.words[1]), "=r"(r.words[2]), "=r"(r.words[3])    \
                 : "l"(address), "l"(policy));                                               \
  } else if constexpr (BYTES == 8) {                                                         \
    asm volatile("ld.global" QUALIFIERS ".L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"         \
                 : "=r"(r.words[0]), "=r"(r.words[1])                                        \
                 : "l"(address), "l"(policy));                                               \
  } else if constexpr (BYTES == 4) {                                                         \
    asm volatile("ld.global" QUALIFIERS ".L2::cache_hint.u32 %0, [%1], %2;"                  \
                 : "=r"(r.words[0])                                                          \
                 : "l"(address), "l"(policy));                                               \
  } else {                                                                                   \
    unsigned short half;                                                                     \
    asm volatile("ld.global" QUALIFIERS ".L2::cache_hint.u16 %0, [%1], %2;"                  \
                 : "=h"(half)                                                                \
                 : "l"(address), "l"(policy));                                               \
    r.words[0] = half;                                                                       \
  }
#endif

// A stream read with L2 priority P: through the read-only path, with the same priority in
// L1, or with COHERENT through the coherent one, for data the kernel itself writes (an
// in-place input, a row it stored).
template <int BYTES, L2Priority P, bool COHERENT = false>
__device__ __forceinline__ Raw<BYTES> load_stream(const void* address) {
#if __CUDA_ARCH__ >= 800
  const unsigned long long policy = l2_policy<P>();
  Raw<BYTES> r;
  if constexpr (COHERENT) {
    KILN_HINTED_LOAD("")
  } else {
    if constexpr (P == L2Priority::evict_last) {
      KILN_HINTED_LOAD(".nc.L1::evict_last")
    } else {
      KILN_HINTED_LOAD(".nc.L1::evict_first")
    }
  }
  return r;
#else
  if constexpr (COHERENT) {
    return load_global<BYTES>(address);
  } else {
    return load_global_nc<BYTES>(address);
  }
#endif
}

#if __CUDA_ARCH__ >= 800
#undef KILN_HINTED_LOAD
#endif

// A store whose lines L2 keeps with priority P.
template <int BYTES, L2Priority P>
__device__ __forceinline__ void store_global(void* address, const Raw<BYTES>& r) {
#if __CUDA_ARCH__ >= 800
  const unsigned long long policy = l2_policy<P>();
  if constexpr (BYTES == 16) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(address),
                 "r"(r.words[0]), "r"(r.words[1]), "r"(r.words[2]), "r"(r.words[3]), "l"(policy)
                 : "memory");
  } else if constexpr (BYTES == 8) {
    asm volatile("st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, %3;" ::"l"(address),
                 "r"(r.words[0]), "r"(r.words[1]), "l"(policy)
                 : "memory");
  } else if constexpr (BYTES == 4) {
    asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" ::"l"(address), "r"(r.words[0]),
                 "l"(policy)
                 : "memory");
  } else {
    const unsigned short half = static_cast<unsigned short>(r.words[0]);
    asm volatile("st.global.L2::cache_hint.u16 [%0], %1, %2;" ::"l"(address), "h"(half), "l"(policy)
                 : "memory");
  }
#else
  store_global<BYTES>(address, r);
#endif
}

}  // namespace kiln

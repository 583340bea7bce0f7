// Global-to-shared copies that hold no registers while in flight (cp.async, sm_80 and
// later), and the shared-memory accesses that read the copies back. Addresses in shared
// memory are 32-bit offsets in the shared window, as the PTX instructions take them.
#pragma once

#include "kiln/common.cuh"

namespace kiln {

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  unsigned address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
      : "=r"(address)
      : "l"(pointer));
  return address;
}

template <int BYTES>
__device__ __forceinline__ Raw<BYTES> load_shared(unsigned address) {
  Raw<BYTES> r;
  if constexpr (BYTES == 16) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.words[0]), "=r"(r.words[1]), "=r"(r.words[2]), "=r"(r.words[3])
                 : "r"(address));
  } else if constexpr (BYTES == 8) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                 : "=r"(r.words[0]), "=r"(r.words[1])
                 : "r"(address));
  } else {
    static_assert(BYTES == 4, "staged vectors are 4, 8 or 16 bytes (cp.async's sizes)");
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r.words[0]) : "r"(address));
  }
  return r;
}

template <int BYTES>
__device__ __forceinline__ void store_shared(unsigned address, const Raw<BYTES>& r) {
  if constexpr (BYTES == 16) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(r.words[0]),
                 "r"(r.words[1]), "r"(r.words[2]), "r"(r.words[3])
                 : "memory");
  } else if constexpr (BYTES == 8) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(address), "r"(r.words[0]), "r"(r.words[1])
                 : "memory");
  } else {
    static_assert(BYTES == 4, "staged vectors are 4, 8 or 16 bytes (cp.async's sizes)");
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(address), "r"(r.words[0]) : "memory");
  }
}

// Starts copying BYTES from global memory to shared memory. 16-byte copies bypass L1
// (.cg: a streamed row is read once); smaller ones may only use .ca. Before sm_80 there is
// no asynchronous copy: the bytes pass through registers, synchronously.
template <int BYTES>
__device__ __forceinline__ void copy_to_shared_async(unsigned address, const void* global) {
#if __CUDA_ARCH__ >= 800
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global)
                 : "memory");
  } else {
    static_assert(BYTES == 4 || BYTES == 8, "cp.async copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(address), "l"(global), "n"(BYTES)
                 : "memory");
  }
#else
  store_shared<BYTES>(address, load_global<BYTES>(global));
#endif
}

// Waits for every copy this thread started. Each thread reads back only what it copied
// itself, so no barrier is needed.
__device__ __forceinline__ void wait_for_shared_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

}  // namespace kiln

// Thread-block clusters (sm_90 and later): a row too wide for one SM to read quickly is
// split over the CTAs of a cluster, and their partial sums meet in distributed shared
// memory. Written in PTX, so that NVRTC needs no cooperative_groups header.
#pragma once

#include "kiln/async_copy.cuh"
#include "kiln/common.cuh"

namespace kiln {

// This CTA's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// A CTA may touch another's shared memory only once that one has started. Every thread
// arrives here first thing (relaxed: it orders nothing) and waits for the others with
// wait_for_cluster() just before its first such access, so the wait overlaps whatever it
// issues in between (the row's loads).
__device__ __forceinline__ void arrive_at_cluster() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void wait_for_cluster() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// Every thread of the cluster: what any thread stored to shared memory (its own CTA's or
// another's) before it is seen by every thread after it.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::
          : "memory");
}

// Stores `value` at `address` (a shared-window address in this CTA's layout) in the shared
// memory of the cluster's CTA `rank`.
__device__ __forceinline__ void store_shared_of_rank(unsigned address, unsigned rank, float value) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(value) : "memory");
}

// The sum of `value` over every thread of a cluster of CLUSTER CTAs of CTA_THREADS threads,
// the same bits in every thread (each CTA normalises its slice of a row with it). Each
// warp's sum is stored into every CTA's buffer (lane r stores to rank r), then one cluster
// barrier, then each thread adds the CLUSTER x warps sums: lane i those at i, i + 32, ...,
// then a butterfly over the warp, whose additions are the same in every lane up to
// operand order, which float addition ignores.
// `parity` picks one of two buffers and must alternate between consecutive calls: a buffer
// is written again only two calls later, past the barrier of the call in between, which no
// thread reaches before it has read the buffer. Before its first call a thread must have
// waited for every CTA of the cluster to start (wait_for_cluster); after its last call's
// barrier no thread touches another CTA's memory, so the CTAs may exit without another.
template <int CTA_THREADS, int CLUSTER>
__device__ __forceinline__ float cluster_sum(float value, int parity) {
  static_assert(CTA_THREADS % 32 == 0, "a clustered CTA is whole warps");
  static_assert(CLUSTER >= 2 && CLUSTER <= 32, "a warp's lanes store to every rank");
  constexpr int kWarps = CTA_THREADS / 32;
  constexpr int kSums = kWarps * CLUSTER;
  __shared__ float warp_sums[2][kSums];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  value = warp_sum<32>(value);
  if (lane < CLUSTER) {
    const int slot = static_cast<int>(cluster_rank()) * kWarps + static_cast<int>(threadIdx.x) / 32;
    store_shared_of_rank(shared_address(&warp_sums[parity][slot]), static_cast<unsigned>(lane),
                         value);
  }
  cluster_barrier();
  float total = 0.0f;
#pragma unroll
  for (int first = 0; first < kSums; first += 32) {
    if (first + lane < kSums) total += warp_sums[parity][first + lane];
  }
  return warp_sum<32>(total);
}

}  // namespace kiln

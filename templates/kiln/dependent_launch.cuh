// Programmatic dependent launch (sm_90). The host may launch a kernel before the kernel
// ahead of it on the stream has finished (kiln does where KILN_PDL allows it), so that its
// CTAs are placed and past their launch while the one ahead drains. Every kernel therefore
// starts with wait_for_prior_grids(), before it touches global memory: it returns once the
// grids this launch depends on have completed and their writes are visible, so neither a
// read of their outputs nor a write over their inputs can overtake them. Launched the plain
// way, it returns at once.
//
// allow_dependent_grids() lets the kernel after this one be launched as early: its CTAs
// then take the SM slots this grid's last CTAs free and wait there, instead of being
// launched only once this grid has ended. It is called right after the wait, since a
// grid's dependents start only once every one of its CTAs has called it or exited, by which
// time all of its CTAs are placed, so the early CTAs never take a slot one of this grid's
// would have used.
//
// Before sm_90 (and in host compiles) both are nothing.
#pragma once

namespace kiln {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, as every kiln kernel begins.
__device__ __forceinline__ void begin_dependent_grid() {
  wait_for_prior_grids();
  allow_dependent_grids();
}

}  // namespace kiln

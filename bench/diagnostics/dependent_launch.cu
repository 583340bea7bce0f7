// What programmatic dependent launch saves between two small kernels (sm_90): a chain of 64
// RMSNorm-like kernels, each reading the one before's output, captured in a CUDA graph and
// launched plainly or with programmatic stream serialization, the wait for the prior grid
// and the dependents' trigger at the kernel's start ("pdl-start", as kiln's kernels do) or
// the trigger at its end ("pdl-end"). "attr-only-nowait" sets the attribute on kernels that
// neither wait nor trigger: then the kernel ahead triggers only by ending, which is why its
// results still match here; kiln's kernels trigger early, so every one must wait. Prints
// microseconds per kernel (median of 30 replays) and mismatches against the plain chain.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>
#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

template <int MODE>  // 0 none, 1 wait+trigger at start, 2 wait at start, trigger at end
__global__ void __launch_bounds__(512)
    norm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int hidden) {
#if __CUDA_ARCH__ >= 900
  if (MODE) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 1) asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int row = blockIdx.x;
  const int t = threadIdx.x;
  const int vecs = hidden / 8;
  float ss = 0.f;
  uint4 v[2];
  uint4 wv[2];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    int c = t + s * blockDim.x;
    if (c < vecs) {
      v[s] = reinterpret_cast<const uint4*>(x + (size_t)row * hidden)[c];
      wv[s] = reinterpret_cast<const uint4*>(w)[c];
    } else {
      v[s] = make_uint4(0, 0, 0, 0);
      wv[s] = v[s];
    }
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v[s]);
    for (int i = 0; i < 8; ++i) {
      float f = __bfloat162float(e[i]);
      ss += f * f;
    }
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  __shared__ float part[16];
  if (t % 32 == 0) part[t / 32] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < blockDim.x / 32; ++i) tot += part[i];
  float r = rsqrtf(tot / hidden + 1e-6f);
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    int c = t + s * blockDim.x;
    if (c < vecs) {
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v[s]);
      const __nv_bfloat16* we = reinterpret_cast<const __nv_bfloat16*>(&wv[s]);
      uint4 o;
      __nv_bfloat16* oe = reinterpret_cast<__nv_bfloat16*>(&o);
      for (int i = 0; i < 8; ++i)
        oe[i] = __float2bfloat16(__bfloat162float(e[i]) * r * __bfloat162float(we[i]) * 1.0001f);
      reinterpret_cast<uint4*>(y + (size_t)row * hidden)[c] = o;
    }
  }
#if __CUDA_ARCH__ >= 900
  if (MODE == 2) asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <int MODE>
void launch(bool attr, int rows, int hidden, const __nv_bfloat16* x, const __nv_bfloat16* w,
            __nv_bfloat16* y, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(rows);
  cfg.blockDim = dim3(hidden / 16 < 32 ? 32 : hidden / 16);
  cfg.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = a;
  cfg.numAttrs = attr ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, norm<MODE>, x, w, y, hidden));
}

int main() {
  const int chain = 64;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int rows : {1, 128, 2688})
    for (int hidden : {4096, 8192}) {
      std::vector<__nv_bfloat16*> buf(chain + 1);
      for (auto& b : buf) CK(cudaMalloc(&b, (size_t)rows * hidden * 2));
      __nv_bfloat16* w;
      CK(cudaMalloc(&w, hidden * 2));
      std::vector<__nv_bfloat16> h((size_t)rows * hidden);
      for (size_t i = 0; i < h.size(); ++i)
        h[i] = __float2bfloat16(((i * 2654435761u) % 1000) / 500.f - 1.f);
      CK(cudaMemcpy(buf[0], h.data(), h.size() * 2, cudaMemcpyHostToDevice));
      std::vector<__nv_bfloat16> hw(hidden, __float2bfloat16(1.f));
      CK(cudaMemcpy(w, hw.data(), hidden * 2, cudaMemcpyHostToDevice));
      const char* names[] = {"plain", "pdl-start", "pdl-end", "attr-only-nowait"};
      std::vector<__nv_bfloat16> ref;
      for (int variant = 0; variant < 4; ++variant) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < chain; ++i) {
          if (variant == 0) launch<0>(false, rows, hidden, buf[i], w, buf[i + 1], s);
          if (variant == 1) launch<1>(true, rows, hidden, buf[i], w, buf[i + 1], s);
          if (variant == 2) launch<2>(true, rows, hidden, buf[i], w, buf[i + 1], s);
          if (variant == 3) launch<0>(true, rows, hidden, buf[i], w, buf[i + 1], s);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        std::vector<float> times;
        for (int rep = 0; rep < 30; ++rep) {
          CK(cudaMemsetAsync(buf[chain], 0, (size_t)rows * hidden * 2, s));
          CK(cudaEventRecord(e0, s));
          CK(cudaGraphLaunch(ge, s));
          CK(cudaEventRecord(e1, s));
          CK(cudaEventSynchronize(e1));
          float ms;
          cudaEventElapsedTime(&ms, e0, e1);
          times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        std::vector<__nv_bfloat16> out((size_t)rows * hidden);
        CK(cudaMemcpy(out.data(), buf[chain], out.size() * 2, cudaMemcpyDeviceToHost));
        int mismatch = 0;
        if (variant == 0)
          ref = out;
        else
          for (size_t i = 0; i < out.size(); ++i) mismatch += memcmp(&out[i], &ref[i], 2) != 0;
        printf("rows %5d hidden %5d %-18s %7.3f us/kernel  mismatches %d\n", rows, hidden,
               names[variant], times[times.size() / 2] * 1000 / chain, mismatch);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
      }
      for (auto& b : buf) cudaFree(b);
      cudaFree(w);
    }
  return 0;
}

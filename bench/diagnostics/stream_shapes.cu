// How the shape of a streaming kernel's work sets its bandwidth: the same copy (16-byte
// vectors read once and written once) done by a covering grid of short-lived CTAs, by CTAs
// that each take a larger piece, by persistent grids (a grid-stride or a blocked walk), and
// with L2 eviction priorities, beside cudaMemcpyAsync. Timed as triton's do_bench times one
// call (a 256 MB L2 flush before it, l2_flush.cuh; CUDA events around it), median of 200 calls, at
// sizes from 22 MB to 1 GiB moved. Build and run on a GPU machine: bash bench/diagnostics/run.sh
#include <cuda_runtime.h>

#include "l2_flush.cuh"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

enum class Priority { none, evict_first };

template <Priority P>
__device__ __forceinline__ uint4 load(const uint4* address, unsigned long long policy) {
  uint4 v;
  if constexpr (P == Priority::none) {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
  } else {
    asm volatile("ld.global.nc.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address), "l"(policy));
  }
  return v;
}

template <Priority P>
__device__ __forceinline__ void store(uint4* address, uint4 v, unsigned long long policy) {
  if constexpr (P == Priority::none) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(address),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
                 : "memory");
  }
}

// One piece: THREADS x U vectors starting at `first`, each thread's U vectors THREADS apart,
// all U loads issued before the stores.
template <int U, int THREADS, Priority LOAD, Priority STORE>
__device__ __forceinline__ void copy_piece(const uint4* in, uint4* out, long long n,
                                           long long first) {
  unsigned long long policy = 0;
  if constexpr (LOAD != Priority::none || STORE != Priority::none) {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = first + threadIdx.x + u * THREADS;
    if (i < n) v[u] = load<LOAD>(in + i, policy);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = first + threadIdx.x + u * THREADS;
    if (i < n) store<STORE>(out + i, v[u], policy);
  }
}

// A covering grid: one piece per CTA.
template <int U, int THREADS, Priority LOAD = Priority::none, Priority STORE = Priority::none>
__global__ void __launch_bounds__(THREADS) covering(const uint4* in, uint4* out, long long n) {
  copy_piece<U, THREADS, LOAD, STORE>(in, out, n, static_cast<long long>(blockIdx.x) * THREADS * U);
}

// A persistent grid walking the pieces grid-stride.
template <int U, int THREADS>
__global__ void __launch_bounds__(THREADS) strided(const uint4* in, uint4* out, long long n) {
  const long long piece = static_cast<long long>(THREADS) * U;
  for (long long first = blockIdx.x * piece; first < n; first += gridDim.x * piece) {
    copy_piece<U, THREADS, Priority::none, Priority::none>(in, out, n, first);
  }
}

// A persistent grid, each CTA a contiguous run of pieces.
template <int U, int THREADS>
__global__ void __launch_bounds__(THREADS) blocked(const uint4* in, uint4* out, long long n) {
  const long long piece = static_cast<long long>(THREADS) * U;
  const long long pieces = (n + piece - 1) / piece;
  const long long per_cta = (pieces + gridDim.x - 1) / gridDim.x;
  const long long end = min(pieces, (blockIdx.x + 1) * per_cta);
  for (long long p = blockIdx.x * per_cta; p < end; ++p) {
    copy_piece<U, THREADS, Priority::none, Priority::none>(in, out, n, p * piece);
  }
}

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

using Launch = std::function<void(const uint4*, uint4*, long long)>;

template <int U, int THREADS, Priority LOAD = Priority::none, Priority STORE = Priority::none>
Launch covering_launch() {
  return [](const uint4* in, uint4* out, long long n) {
    const long long piece = static_cast<long long>(THREADS) * U;
    covering<U, THREADS, LOAD, STORE>
        <<<static_cast<unsigned>((n + piece - 1) / piece), THREADS>>>(in, out, n);
  };
}

template <typename Kernel>
Launch persistent_launch(Kernel kernel, int threads, int ctas_per_sm, int sms) {
  return [=](const uint4* in, uint4* out, long long n) {
    kernel<<<sms * ctas_per_sm, threads>>>(in, out, n);
  };
}

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  const size_t flush_bytes = size_t{256} << 20;
  const size_t max_side = size_t{1} << 29;  // 512 MB read + 512 MB written
  void *flush, *src, *dst;
  check(cudaMalloc(&flush, flush_bytes), "cudaMalloc");
  check(cudaMalloc(&src, max_side), "cudaMalloc");
  check(cudaMalloc(&dst, max_side), "cudaMalloc");
  check(cudaMemset(src, 1, max_side), "cudaMemset");
  struct Variant {
    std::string name;
    Launch launch;  // null: cudaMemcpyAsync
  };
  const std::vector<Variant> variants = {
      {"memcpy", nullptr},
      {"cover 1x256 (4 KB a CTA)", covering_launch<1, 256>()},
      {"cover 2x128 (4 KB a CTA)", covering_launch<2, 128>()},
      {"cover 1x1024 (16 KB a CTA)", covering_launch<1, 1024>()},
      {"cover 4x256 (16 KB a CTA)", covering_launch<4, 256>()},
      {"cover 1x256 loads evict_first", covering_launch<1, 256, Priority::evict_first>()},
      {"cover 1x256 loads+stores evict_first",
       covering_launch<1, 256, Priority::evict_first, Priority::evict_first>()},
      {"persistent stride 1x256, 8 CTAs/SM", persistent_launch(strided<1, 256>, 256, 8, sms)},
      {"persistent stride 1x256, 64 CTAs/SM", persistent_launch(strided<1, 256>, 256, 64, sms)},
      {"persistent blocked 1x256, 8 CTAs/SM", persistent_launch(blocked<1, 256>, 256, 8, sms)},
  };
  const double moved_mb[] = {22, 128, 344, 1024};
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::printf("%-40s", "us (median of 200), MB moved:");
  for (double mb : moved_mb) std::printf(" %9.0f", mb);
  std::printf("\n");
  for (const Variant& variant : variants) {
    std::printf("%-40s", variant.name.c_str());
    for (double mb : moved_mb) {
      const size_t side = static_cast<size_t>(mb * 1e6 / 2) / 4096 * 4096;
      const long long vectors = static_cast<long long>(side / 16);
      std::vector<float> times;
      for (int call = 0; call < 220; ++call) {
        check(flush_l2(flush, flush_bytes), "flush_l2");
        check(cudaEventRecord(start), "cudaEventRecord");
        if (variant.launch) {
          variant.launch(static_cast<const uint4*>(src), static_cast<uint4*>(dst), vectors);
        } else {
          check(cudaMemcpyAsync(dst, src, side, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
        }
        check(cudaEventRecord(stop), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        if (call >= 20) times.push_back(ms * 1000);
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      std::printf(" %9.2f", times[times.size() / 2]);
    }
    std::printf("\n");
  }
  check(cudaGetLastError(), "a launch");
  // Every variant copies the same bytes: the last one's output must be the input.
  std::vector<unsigned char> head(1 << 20);
  check(cudaMemcpy(head.data(), dst, head.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  const long bad = std::count_if(head.begin(), head.end(), [](unsigned char c) { return c != 1; });
  std::printf("copied bytes differing from the source: %ld\n", bad);
  return bad == 0 ? 0 : 1;
}

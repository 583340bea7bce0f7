// How the size of a kernel's by-value parameters sets a launch-bound call's time: the same
// kernel (one 16-byte vector read and written per thread, reading only the two pointers at the
// front of its parameters) declared with parameter blocks of 16 bytes to 1 KB, for 1 CTA and
// for 128. Each call is timed as triton's do_bench times one (a 256 MB L2 flush before it,
// l2_flush.cuh; CUDA events around it), the sizes interleaved in shuffled rounds, 3000 calls each,
// two ways: the host waiting for each call before it queues the next, and, as bench/common.py times
// kiln beside its peers, 25 calls queued at once behind a GPU sleep longer than the host takes to
// queue them.
// Build and run on a GPU machine: bash bench/diagnostics/run.sh
#include <cuda_runtime.h>

#include "l2_flush.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <int BYTES>
struct Params {
  const uint4* in;
  uint4* out;
  int unused[(BYTES - 16) / 4];
};

template <>
struct Params<16> {
  const uint4* in;
  uint4* out;
};

// Holds the stream while the host queues a chunk of calls behind it.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

template <int BYTES>
__global__ void touch(const Params<BYTES> p) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  uint4 v = p.in[i];
  v.x += 1;
  p.out[i] = v;
}

struct Variant {
  int bytes;
  std::function<void(int ctas)> launch;
};

template <int BYTES>
Variant variant(const void* in, void* out) {
  static_assert(sizeof(Params<BYTES>) == BYTES);
  Params<BYTES> p{};
  p.in = static_cast<const uint4*>(in);
  p.out = static_cast<uint4*>(out);
  return {BYTES, [p](int ctas) { touch<BYTES><<<ctas, 256>>>(p); }};
}

}  // namespace

int main() {
  const size_t flush_bytes = size_t{256} << 20;
  void *flush, *in, *out;
  check(cudaMalloc(&flush, flush_bytes), "cudaMalloc");
  check(cudaMalloc(&in, 1 << 20), "cudaMalloc");
  check(cudaMalloc(&out, 1 << 20), "cudaMalloc");
  check(cudaMemset(in, 1, 1 << 20), "cudaMemset");
  const std::vector<Variant> variants = {
      variant<16>(in, out),  variant<96>(in, out),  variant<128>(in, out), variant<192>(in, out),
      variant<200>(in, out), variant<240>(in, out), variant<256>(in, out), variant<288>(in, out),
      variant<360>(in, out), variant<1024>(in, out)};
  constexpr int kChunk = 25;
  std::vector<cudaEvent_t> starts(kChunk), stops(kChunk);
  for (int i = 0; i < kChunk; ++i) {
    check(cudaEventCreate(&starts[i]), "cudaEventCreate");
    check(cudaEventCreate(&stops[i]), "cudaEventCreate");
  }
  std::printf("%-22s %12s %12s %12s %12s\n", "us, mean of middle half", "1 CTA", "128 CTAs",
              "1 queued", "128 queued");
  std::vector<std::vector<double>> means(variants.size());
  for (int queued : {0, 1}) {
    for (int ctas : {1, 128}) {
      std::vector<std::vector<float>> times(variants.size());
      std::vector<int> order;  // a chunk's calls: variant indices
      std::mt19937 shuffle(ctas + 7 * queued);
      for (int round = 0; round < 3020; ++round) {
        std::vector<int> sizes(variants.size());
        for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = static_cast<int>(i);
        std::shuffle(sizes.begin(), sizes.end(), shuffle);
        order.insert(order.end(), sizes.begin(), sizes.end());
        const bool last = round + 1 == 3020;
        const size_t chunk = queued ? kChunk : 1;
        while (order.size() >= chunk || (last && !order.empty())) {
          const size_t n = std::min(order.size(), chunk);
          if (queued) spin<<<1, 1>>>(2'000'000);  // about 1 ms at 2 GHz
          for (size_t i = 0; i < n; ++i) {
            check(flush_l2(flush, flush_bytes), "flush_l2");
            check(cudaEventRecord(starts[i]), "cudaEventRecord");
            variants[order[i]].launch(ctas);
            check(cudaEventRecord(stops[i]), "cudaEventRecord");
          }
          check(cudaEventSynchronize(stops[n - 1]), "cudaEventSynchronize");
          for (size_t i = 0; i < n; ++i) {
            float ms = 0;
            check(cudaEventElapsedTime(&ms, starts[i], stops[i]), "cudaEventElapsedTime");
            if (round >= 20) times[order[i]].push_back(ms * 1000);
          }
          order.erase(order.begin(), order.begin() + static_cast<long>(n));
        }
      }
      // The mean of the middle half: a call after the flush takes one of two levels (see
      // flush_alternation), so a median jumps between them where this moves smoothly.
      for (size_t k = 0; k < variants.size(); ++k) {
        std::vector<float>& t = times[k];
        std::sort(t.begin(), t.end());
        double sum = 0;
        for (size_t j = t.size() / 4; j < 3 * t.size() / 4; ++j) sum += t[j];
        means[k].push_back(sum / static_cast<double>(3 * t.size() / 4 - t.size() / 4));
      }
    }
  }
  check(cudaGetLastError(), "a launch");
  for (size_t k = 0; k < variants.size(); ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "parameters %d B", variants[k].bytes);
    std::printf("%-22s %12.3f %12.3f %12.3f %12.3f\n", name, means[k][0], means[k][1], means[k][2],
                means[k][3]);
  }
  return 0;
}

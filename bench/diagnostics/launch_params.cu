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

#include "interleaved_rounds.cuh"

#include <cstdio>
#include <functional>
#include <vector>

namespace {

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
  std::printf("%-22s %12s %12s %12s %12s\n", "us, mean of middle half", "1 CTA", "128 CTAs",
              "1 queued", "128 queued");
  std::vector<std::vector<double>> means(variants.size());
  for (int queued : {0, 1}) {
    for (int ctas : {1, 128}) {
      const std::vector<std::vector<float>> times = time_interleaved(
          variants.size(), 3020, queued != 0, static_cast<unsigned>(ctas + 7 * queued), flush,
          flush_bytes, [&](int v) { variants[v].launch(ctas); });
      for (size_t k = 0; k < variants.size(); ++k) means[k].push_back(middle_half_mean(times[k]));
    }
  }
  for (size_t k = 0; k < variants.size(); ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "parameters %d B", variants[k].bytes);
    std::printf("%-22s %12.3f %12.3f %12.3f %12.3f\n", name, means[k][0], means[k][1], means[k][2],
                means[k][3]);
  }
  return 0;
}

// Where a launch-bound norm's time goes: a bf16 RMSNorm of 4096-wide rows built up step by step
// from a plain copy of its row (the weight read, the reduction, the threads a row is split
// over, the wait for the prior grid, the parameter bytes, a cluster split), each timed as
// bench/common.py times kiln beside its peers: the benches' L2 flush before every call
// (l2_flush.cuh), CUDA events around it, 25 calls queued behind a GPU sleep, the variants
// interleaved in shuffled rounds. At 1 and 128 rows. Beside them cudaMemcpyAsync of the row's
// bytes and of the norm's (x, weight and output), and a one-element kernel. Last, the norm
// launched as kiln launches it on sm_90 (programmatic stream serialization) with parameter
// blocks of 24 bytes to 1 KB.
// Build and run on a GPU machine: bash bench/diagnostics/run.sh
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bf16_row_math.cuh"
#include "interleaved_rounds.cuh"
#include "kiln/norm_params.cuh"  // templates/ on the include path

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace {

constexpr int kHidden = 4096;
constexpr int kVectors = kHidden / 8;  // 16-byte vectors of a row

template <int PAD>
struct Params {
  const uint4* x;
  const uint4* w;
  uint4* out;
  int unused[PAD];
};

__global__ void one_element(float* x) {
  x[0] += 1.0f;
}

using bf16_row::block_sum;
using bf16_row::scaled;
using bf16_row::squares;
using bf16_row::warp_sum;

// One row a CTA of THREADS threads, kVectors / THREADS vectors a thread, loaded together.
// WEIGHT: the weight's vectors are loaded with the row's and multiplied in. REDUCE: the sum
// of squares over the row (warp shuffles, then shared memory and one barrier), else the row is
// only copied (times 1). PDL: griddepcontrol.wait and launch_dependents first, as kiln's.
template <int THREADS, bool WEIGHT, bool REDUCE, bool PDL, int PAD>
__global__ void __launch_bounds__(THREADS) row_kernel(const Params<PAD> p) {
#if __CUDA_ARCH__ >= 900
  if constexpr (PDL) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
#endif
  constexpr int kSteps = kVectors / THREADS;
  const uint4* x = p.x + static_cast<size_t>(blockIdx.x) * kVectors;
  uint4 v[kSteps];
  uint4 w[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    v[s] = __ldg(x + threadIdx.x + s * THREADS);
    if constexpr (WEIGHT) w[s] = __ldg(p.w + threadIdx.x + s * THREADS);
  }
  float r = 1.0f;
  if constexpr (REDUCE) {
    float ss = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) ss += squares(v[s]);
    ss = block_sum<THREADS>(ss);
    r = rsqrtf(ss * (1.0f / kHidden) + 1e-6f);
  }
  uint4* out = p.out + static_cast<size_t>(blockIdx.x) * kVectors;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    out[threadIdx.x + s * THREADS] = scaled(v[s], w[s], r, WEIGHT);
  }
}

// A row split over the CLUSTER CTAs of a cluster, one vector a thread, the per-warp sums
// stored into every CTA's shared memory and one cluster barrier.
template <int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(kVectors / CLUSTER)
    cluster_kernel(const Params<0> p) {
  namespace cg = cooperative_groups;
  constexpr int kThreads = kVectors / CLUSTER;
  constexpr int kWarps = kThreads / 32;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const size_t row = blockIdx.x / CLUSTER;
  const int col = static_cast<int>(rank) * kThreads + static_cast<int>(threadIdx.x);
  const uint4 v = __ldg(p.x + row * kVectors + col);
  const uint4 w = __ldg(p.w + col);
  __shared__ float part[CLUSTER * kWarps];
  const float ss = warp_sum(squares(v));
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane < CLUSTER) {
    float* remote = cluster.map_shared_rank(part, lane);
    remote[rank * kWarps + threadIdx.x / 32] = ss;
  }
  cluster.sync();
  float total = 0.0f;
  for (int i = lane; i < CLUSTER * kWarps; i += 32) total += part[i];
  total = warp_sum(total);
  const float r = rsqrtf(total * (1.0f / kHidden) + 1e-6f);
  p.out[row * kVectors + col] = scaled(v, w, r, true);
}

struct Variant {
  std::string name;
  std::function<void(int rows)> launch;
};

template <int THREADS, bool WEIGHT, bool REDUCE, bool PDL, int PAD = 0>
Variant row_variant(const std::string& name, const void* x, const void* w, void* out) {
  Params<PAD> p{};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.out = static_cast<uint4*>(out);
  return {name,
          [p](int rows) { row_kernel<THREADS, WEIGHT, REDUCE, PDL, PAD><<<rows, THREADS>>>(p); }};
}

// As row_variant, launched as kiln launches on sm_90: cudaLaunchKernelEx with programmatic
// stream serialization, the kernel waiting for the prior grid.
template <int PAD>
Variant pdl_variant(const void* x, const void* w, void* out) {
  Params<PAD> p{};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.out = static_cast<uint4*>(out);
  const std::string name = "norm 512, PDL, " + std::to_string(sizeof(Params<PAD>)) + " B";
  return {name, [p](int rows) {
            cudaLaunchConfig_t config{};
            config.gridDim = dim3(rows);
            config.blockDim = dim3(512);
            cudaLaunchAttribute attribute{};
            attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attribute.val.programmaticStreamSerializationAllowed = 1;
            config.attrs = &attribute;
            config.numAttrs = 1;
            check(cudaLaunchKernelEx(&config, row_kernel<512, true, true, true, PAD>, p),
                  "cudaLaunchKernelEx");
          }};
}

void check_driver(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* text = nullptr;
    cuGetErrorString(r, &text);
    std::printf("%s: %s\n", what, text != nullptr ? text : "?");
    std::exit(1);
  }
}

// A kernel from PTX taking kiln::NormPlainArgs (a 4096-wide bf16 row with weight): kiln's own
// rms_norm, as `kiln compile --format ptx` wrote it, or a norm_ladder step, launched as kiln
// launches its kernels: programmatic stream serialization, CTA_THREADS threads a row.
Variant ptx_variant(const std::string& ptx_path, const std::string& entry, int cta_threads,
                    const void* x, const void* w, void* out) {
  std::ifstream file(ptx_path);
  const std::string ptx((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (ptx.empty()) {
    std::printf("cannot read %s\n", ptx_path.c_str());
    std::exit(1);
  }
  CUmodule module;
  CUfunction function;
  check_driver(cuModuleLoadData(&module, ptx.c_str()), "cuModuleLoadData");
  check_driver(cuModuleGetFunction(&function, module, entry.c_str()), "cuModuleGetFunction");
  kiln::NormPlainArgs args{};
  args.out = out;
  args.x = x;
  args.weight = w;
  args.x_row_stride = kHidden;
  args.out_row_stride = kHidden;
  args.eps = 1e-6f;
  // kiln's kernels are named by their file (their entries are mangled); other kernels, such as
  // norm_ladder's, by file and entry.
  std::string label = ptx_path.substr(ptx_path.find_last_of('/') + 1);
  if (entry.rfind("_Z", 0) != 0) label += ":" + entry;
  return {label + ", t" + std::to_string(cta_threads), [=](int rows) mutable {
            args.rows = rows;
            void* params[] = {&args};
            CUlaunchConfig config{};
            config.gridDimX = static_cast<unsigned>(rows);
            config.gridDimY = config.gridDimZ = 1;
            config.blockDimX = static_cast<unsigned>(cta_threads);
            config.blockDimY = config.blockDimZ = 1;
            CUlaunchAttribute attribute{};
            attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attribute.value.programmaticStreamSerializationAllowed = 1;
            config.attrs = &attribute;
            config.numAttrs = 1;
            check_driver(cuLaunchKernelEx(&config, function, params, nullptr), "cuLaunchKernelEx");
          }};
}

template <int CLUSTER>
Variant cluster_variant(const std::string& name, const void* x, const void* w, void* out) {
  Params<0> p{};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.out = static_cast<uint4*>(out);
  return {name,
          [p](int rows) { cluster_kernel<CLUSTER><<<rows * CLUSTER, kVectors / CLUSTER>>>(p); }};
}

}  // namespace

// Optional arguments: triples of a PTX file of a kernel taking kiln::NormPlainArgs (kiln's
// rms_norm, 4096 wide, bf16, with weight, one row a CTA, or norm_ladder's steps), its entry
// name and its CTA threads, to time beside the kernels here (two builds' kernels, say, in the
// same rounds).
int main(int argc, char** argv) {
  const size_t flush_bytes = size_t{256} << 20;
  constexpr int kMaxRows = 128;
  const size_t row_bytes = kHidden * 2;
  void *flush, *x, *w, *out, *copy_in, *copy_out, *scalar;
  check(cudaMalloc(&flush, flush_bytes), "cudaMalloc");
  check(cudaMalloc(&x, kMaxRows * row_bytes), "cudaMalloc");
  check(cudaMalloc(&w, row_bytes), "cudaMalloc");
  check(cudaMalloc(&out, kMaxRows * row_bytes), "cudaMalloc");
  check(cudaMalloc(&copy_in, 2 * kMaxRows * row_bytes), "cudaMalloc");
  check(cudaMalloc(&copy_out, 2 * kMaxRows * row_bytes), "cudaMalloc");
  check(cudaMalloc(&scalar, 4), "cudaMalloc");
  check(cudaMemset(x, 0x3f, kMaxRows * row_bytes), "cudaMemset");
  check(cudaMemset(w, 0x3f, row_bytes), "cudaMemset");
  check(cudaMemset(copy_in, 0x3f, 2 * kMaxRows * row_bytes), "cudaMemset");

  std::vector<Variant> variants = {
      {"one-element kernel", [scalar](int) { one_element<<<1, 1>>>(static_cast<float*>(scalar)); }},
      {"cudaMemcpy, row bytes",
       [=](int rows) {
         check(cudaMemcpyAsync(copy_out, copy_in, rows * row_bytes, cudaMemcpyDeviceToDevice),
               "cudaMemcpyAsync");
       }},
      {"cudaMemcpy, norm's bytes",
       [=](int rows) {
         // x, weight and output: (rows + 1) rows read and rows written, as one copy
         check(cudaMemcpyAsync(copy_out, copy_in, (2 * rows + 1) * row_bytes / 2,
                               cudaMemcpyDeviceToDevice),
               "cudaMemcpyAsync");
       }},
      row_variant<512, false, false, false>("copy the row, 512 thr", x, w, out),
      row_variant<512, true, false, false>("+ weight", x, w, out),
      row_variant<512, false, true, false>("+ reduce (no weight)", x, w, out),
      row_variant<512, true, true, false>("norm, 512 thr", x, w, out),
      row_variant<256, true, true, false>("norm, 256 thr x2", x, w, out),
      row_variant<128, true, true, false>("norm, 128 thr x4", x, w, out),
      row_variant<32, true, true, false>("norm, 1 warp x16", x, w, out),
      row_variant<512, true, true, true>("norm 512 + pdl wait", x, w, out),
      row_variant<512, true, true, false, 54>("norm 512, 240 B params", x, w, out),
      row_variant<128, false, false, false>("copy the row, 128 thr", x, w, out),
      cluster_variant<4>("norm, cluster 4 x 128", x, w, out),
      cluster_variant<8>("norm, cluster 8 x 64", x, w, out),
      pdl_variant<0>(x, w, out),
      pdl_variant<10>(x, w, out),
      pdl_variant<18>(x, w, out),
      pdl_variant<26>(x, w, out),
      pdl_variant<34>(x, w, out),
      pdl_variant<38>(x, w, out),
      pdl_variant<42>(x, w, out),
      pdl_variant<46>(x, w, out),
      pdl_variant<50>(x, w, out),
      pdl_variant<54>(x, w, out),
      pdl_variant<58>(x, w, out),
      pdl_variant<60>(x, w, out),
      pdl_variant<66>(x, w, out),
      pdl_variant<74>(x, w, out),
      pdl_variant<98>(x, w, out),
      pdl_variant<122>(x, w, out),
      pdl_variant<250>(x, w, out),
  };
  check(cudaFree(nullptr), "cudaFree");  // the runtime's context, for the driver API too
  if (argc > 3) {
    variants.push_back(
        row_variant<256, true, true, true>("norm, 256 thr x2 + pdl wait", x, w, out));
  }
  for (int i = 1; i + 2 < argc; i += 3) {
    variants.push_back(ptx_variant(argv[i], argv[i + 1], std::atoi(argv[i + 2]), x, w, out));
  }
  static_assert(sizeof(Params<54>) == 240 && sizeof(Params<10>) == 64 &&
                sizeof(Params<42>) == 192 && sizeof(Params<98>) == 416);

  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "attribute");
  std::vector<std::vector<double>> medians(variants.size()), means(variants.size());
  for (int rows : {1, 128}) {
    const std::vector<std::vector<float>> times =
        time_interleaved(variants.size(), 2020, true, static_cast<unsigned>(rows), flush,
                         flush_bytes, [&](int v) { variants[v].launch(rows); });
    for (size_t k = 0; k < variants.size(); ++k) {
      medians[k].push_back(median(times[k]));
      means[k].push_back(middle_half_mean(times[k]));
    }
  }
  std::printf(
      "one_row: bf16 RMSNorm of %d-wide rows built up from a copy; us, queued, after the "
      "benches' flush (median / mean of the middle half); clock %d MHz\n",
      kHidden, clock_khz / 1000);
  std::printf("%-28s %18s %18s\n", "variant", "1 row", "128 rows");
  for (size_t k = 0; k < variants.size(); ++k) {
    std::printf("%-28s %8.3f / %7.3f %8.3f / %7.3f\n", variants[k].name.c_str(), medians[k][0],
                means[k][0], medians[k][1], means[k][1]);
  }
  return 0;
}

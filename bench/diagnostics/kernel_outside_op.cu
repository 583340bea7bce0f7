// kiln's own compiled RMSNorm kernel (and, to compare builds, another build's cubin of it),
// loaded and launched here with the driver API instead of through the op, so that
// kernel_outside_op.py can time the kernel apart from what the op call adds around it (its
// output, its launch path) and into outputs it places; and a minimal hand-written RMSNorm of
// the same geometry beside it. Built by torch's cpp_extension from that script.
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "kiln/dependent_launch.cuh"  // templates/ on the include path
#include "kiln/norm_params.cuh"

#include <string>
#include <vector>

namespace {

struct LoadedKernel {
  CUfunction function;
  unsigned threads;
};
std::vector<LoadedKernel> g_kernels;  // modules stay loaded for the process's life

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(result, &name);
    TORCH_CHECK(false, what, " failed: ", name ? name : "unknown error");
  }
}

// `image`: a cubin kiln.compile returned (or one of another kiln build's, to compare two in one
// process); `name`: its lowered kernel name; one row a CTA of `threads` threads. Returns the
// index `launch` takes.
int load_kernel(const std::string& image, const std::string& name, int threads) {
  CUmodule module = nullptr;
  check(cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  LoadedKernel loaded{nullptr, static_cast<unsigned>(threads)};
  check(cuModuleGetFunction(&loaded.function, module, name.c_str()), "cuModuleGetFunction");
  g_kernels.push_back(loaded);
  return static_cast<int>(g_kernels.size()) - 1;
}

// One launch of loaded kernel `kernel` over x's rows into `out`, programmatic (as kiln
// launches on sm_90) or plain.
void launch(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& out,
            double eps, bool programmatic, int kernel) {
  TORCH_CHECK(kernel >= 0 && kernel < static_cast<int>(g_kernels.size()), "no loaded kernel ",
              kernel, " (load_kernel first)");
  const CUfunction function = g_kernels[kernel].function;
  const unsigned threads = g_kernels[kernel].threads;
  kiln::NormPlainArgs args{};  // an RMSNorm's parameters, without bias
  args.out = out.data_ptr();
  args.x = x.data_ptr();
  args.weight = weight.data_ptr();
  args.rows = x.size(0);
  args.x_row_stride = x.stride(0);
  args.out_row_stride = out.stride(0);
  args.eps = static_cast<float>(eps);
  void* params[] = {&args};
  CUstream stream = at::cuda::getCurrentCUDAStream().stream();
  const auto grid = static_cast<unsigned>(x.size(0));
  if (!programmatic) {
    check(cuLaunchKernel(function, grid, 1, 1, threads, 1, 1, 0, stream, params, nullptr),
          "cuLaunchKernel");
    return;
  }
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = grid;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check(cuLaunchKernelEx(&config, function, params, nullptr), "cuLaunchKernelEx");
}

// The minimal kernel: one 4096-wide bf16 row a CTA of THREADS threads, STEPS 16-byte vectors
// each, a warp-shuffle and shared-memory block sum. x and the weight are loaded at entry in the
// source; ptxas issues the weight's loads after the block sum (SASS, sm_90). TOUCH: thread
// 0 of each CTA loads its output row's first word at entry, so that the address's translation
// is under way while the row's loads are (a new tensor's pages may not be in the TLBs). The
// loaded word joins the sum of squares as a zero (its mantissa bits times 0), or ptxas would
// sink the load below the sum, as it does the weight's; an L2 prefetch it sinks likewise.
__device__ __forceinline__ uint4 load_nc(const uint4* address) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(address));
  return r;
}
__device__ __forceinline__ float element(const uint4& v, int i) {
  const unsigned word = (&v.x)[i / 2];
  return __uint_as_float(i % 2 ? (word & 0xffff0000u) : (word << 16));
}
__device__ __forceinline__ unsigned pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
template <int THREADS>
__device__ __forceinline__ float block_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float partial[THREADS / 32];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < THREADS / 32 ? partial[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int THREADS, int STEPS, bool WAIT_FOR_PRIOR_GRID, bool TOUCH = false>
__global__ void __launch_bounds__(THREADS)
    minimal_rms_norm(const uint4* __restrict__ x, const uint4* __restrict__ weight,
                     uint4* __restrict__ out, float eps) {
  if constexpr (WAIT_FOR_PRIOR_GRID) kiln::begin_dependent_grid();  // as kiln's kernels begin
  constexpr int kVectors = THREADS * STEPS;
  const unsigned t = threadIdx.x;
  uint4* out_row = out + blockIdx.x * kVectors;
  unsigned touched = 0;
  if constexpr (TOUCH) {
    if (t == 0) asm volatile("ld.global.u32 %0, [%1];" : "=r"(touched) : "l"(out_row));
  }
  const uint4* row = x + blockIdx.x * kVectors;
  uint4 v[STEPS], w[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) v[s] = load_nc(row + s * THREADS + t);
#pragma unroll
  for (int s = 0; s < STEPS; ++s) w[s] = load_nc(weight + s * THREADS + t);
  float squares = TOUCH ? __uint_as_float(touched & 0x007fffffu) * 0.0f : 0.0f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
#pragma unroll
    for (int i = 0; i < 8; ++i) squares += element(v[s], i) * element(v[s], i);
  }
  const float scale = rsqrtf(block_sum<THREADS>(squares) * (1.0f / (kVectors * 8)) + eps);
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    uint4 r;
    unsigned* words = &r.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      words[i] = pack(element(v[s], 2 * i) * scale * element(w[s], 2 * i),
                      element(v[s], 2 * i + 1) * scale * element(w[s], 2 * i + 1));
    }
    out_row[s * THREADS + t] = r;
  }
}

// The minimal kernel over x's rows (4096 wide, 128 threads a row), plain (with or without the
// touch) or as kiln launches.
void launch_minimal(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& out,
                    double eps, bool programmatic, bool touch) {
  TORCH_CHECK(x.size(1) == 4096 && x.is_contiguous() && out.is_contiguous(),
              "the minimal kernel takes contiguous 4096-wide rows");
  const auto* in = static_cast<const uint4*>(x.data_ptr());
  const auto* w = static_cast<const uint4*>(weight.data_ptr());
  auto* o = static_cast<uint4*>(out.data_ptr());
  const auto e = static_cast<float>(eps);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const dim3 grid(static_cast<unsigned>(x.size(0)));
  if (!programmatic) {
    if (touch) {
      minimal_rms_norm<128, 4, false, true><<<grid, 128, 0, stream>>>(in, w, o, e);
    } else {
      minimal_rms_norm<128, 4, false, false><<<grid, 128, 0, stream>>>(in, w, o, e);
    }
    return;
  }
  TORCH_CHECK(!touch, "the programmatic launch is timed without the touch");
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(128);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  TORCH_CHECK(cudaLaunchKernelEx(&config, minimal_rms_norm<128, 4, true, false>, in, w, o, e) ==
              cudaSuccess);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("load_kernel", &load_kernel);
  m.def("launch", &launch, py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("eps"),
        py::arg("programmatic"), py::arg("kernel") = 0);
  m.def("launch_minimal", &launch_minimal);
}

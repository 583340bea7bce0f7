// Why the tuner times its candidates in interleaved rounds: after an L2 flush, the time of a
// microsecond kernel alternates between two levels from one repetition to the next. This times
// one kernel 200 times, each after a flush (a memset, a write kernel, a read kernel, or none),
// with an even and then an odd number of flushes before the first timed run, and prints the
// mean of the even- and odd-numbered repetitions.
// Build and run on a GPU machine: bash bench/diagnostics/run.sh
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

namespace {

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorString(result, &name);
  std::fprintf(stderr, "%s failed: %s\n", what, name ? name : "unknown error");
  std::exit(1);
}

std::vector<char> read_file(const char* path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(1);
  }
  return {std::istreambuf_iterator<char>(file), {}};
}

}  // namespace

int main(int argc, char** argv) {
  const char* cubin = argc > 1 ? argv[1] : "kernels.cubin";
  int rows = argc > 2 ? std::atoi(argv[2]) : 1;
  check(cuInit(0), "cuInit");
  CUdevice device;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  const std::vector<char> image = read_file(cubin);
  CUmodule module;
  check(cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  CUfunction kernel, write_flush, read_flush;
  check(cuModuleGetFunction(&kernel, module, "rms_norm_row"), "cuModuleGetFunction");
  check(cuModuleGetFunction(&write_flush, module, "flush_by_writing"), "cuModuleGetFunction");
  check(cuModuleGetFunction(&read_flush, module, "flush_by_reading"), "cuModuleGetFunction");

  int hidden = 4096;
  float eps = 1e-6f;
  int l2_bytes = 0;
  check(cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device), "L2 size");
  const size_t flush_bytes = 2 * static_cast<size_t>(l2_bytes);
  CUdeviceptr x, w, y, flush, sink;
  check(cuMemAlloc(&x, static_cast<size_t>(rows) * hidden * 2), "cuMemAlloc");
  check(cuMemAlloc(&w, hidden * 2), "cuMemAlloc");
  check(cuMemAlloc(&y, static_cast<size_t>(rows) * hidden * 2), "cuMemAlloc");
  check(cuMemAlloc(&flush, flush_bytes), "cuMemAlloc");
  check(cuMemAlloc(&sink, 64), "cuMemAlloc");
  check(cuMemsetD16(x, 0x3f80, static_cast<size_t>(rows) * hidden), "cuMemsetD16");  // 1.0
  check(cuMemsetD16(w, 0x3f80, hidden), "cuMemsetD16");
  CUstream stream;
  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  constexpr int kReps = 200, kWarm = 20;
  std::vector<CUevent> starts(kReps), ends(kReps);
  for (int i = 0; i < kReps; ++i) {
    check(cuEventCreate(&starts[i], 0), "cuEventCreate");
    check(cuEventCreate(&ends[i], 0), "cuEventCreate");
  }
  void* kernel_args[] = {&x, &w, &y, &rows, &hidden, &eps};
  size_t vectors = flush_bytes / 16;
  void* write_args[] = {&flush, &vectors};
  void* read_args[] = {&flush, &vectors, &sink};
  const auto launch = [&] {
    check(cuLaunchKernel(kernel, std::min(rows, 1056), 1, 1, 256, 1, 1, 0, stream, kernel_args,
                         nullptr),
          "cuLaunchKernel");
  };
  const char* names[] = {"memset", "write kernel", "read kernel", "no flush"};
  const auto flush_l2 = [&](int method) {
    if (method == 0) check(cuMemsetD8Async(flush, 0, flush_bytes, stream), "cuMemsetD8Async");
    if (method == 1)
      check(cuLaunchKernel(write_flush, 1056, 1, 1, 512, 1, 1, 0, stream, write_args, nullptr),
            "cuLaunchKernel");
    if (method == 2)
      check(cuLaunchKernel(read_flush, 1056, 1, 1, 512, 1, 1, 0, stream, read_args, nullptr),
            "cuLaunchKernel");
  };

  std::printf("rms_norm_row, %d row(s) x %d bf16, flush %zu MB; us per run\n", rows, hidden,
              flush_bytes >> 20);
  for (int method = 0; method < 4; ++method) {
    for (int odd = 0; odd < 2; ++odd) {
      for (int i = 0; i < kWarm + odd; ++i) {
        flush_l2(method);
        launch();
      }
      for (int i = 0; i < kReps; ++i) {
        flush_l2(method);
        check(cuEventRecord(starts[i], stream), "cuEventRecord");
        launch();
        check(cuEventRecord(ends[i], stream), "cuEventRecord");
      }
      check(cuStreamSynchronize(stream), "cuStreamSynchronize");
      std::vector<float> us(kReps);
      double even_mean = 0, odd_mean = 0;
      for (int i = 0; i < kReps; ++i) {
        check(cuEventElapsedTime(&us[i], starts[i], ends[i]), "cuEventElapsedTime");
        us[i] *= 1e3f;
        (i % 2 ? odd_mean : even_mean) += us[i] / (kReps / 2);
      }
      std::sort(us.begin(), us.end());
      std::printf("%-12s %s warm-up: median %.3f, even runs %.3f, odd runs %.3f\n", names[method],
                  odd ? "odd " : "even", us[kReps / 2], even_mean, odd_mean);
    }
  }
  return 0;
}

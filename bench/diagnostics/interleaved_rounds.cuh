// The timing loop of the launch-bound diagnostics (launch_params, one_row): every variant
// called once a round, in an order shuffled with a fixed seed, each call after the benches'
// L2 flush (l2_flush.cuh) with CUDA events around it; queued, chunks of 25 calls go behind a
// GPU sleep longer than the host takes to queue them, as bench/common.py times kiln beside
// its peers, else the host waits for each call before it queues the next.
#pragma once

#include <cuda_runtime.h>

#include "l2_flush.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Holds the stream while the host queues a chunk of calls behind it.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Microseconds of each call of each of `variants` (call(v) launches variant v once), after
// `warm_rounds` untimed rounds, `rounds` rounds in all.
template <typename Call>
std::vector<std::vector<float>> time_interleaved(size_t variants, int rounds, bool queued,
                                                 unsigned seed, void* flush, size_t flush_bytes,
                                                 Call call, int warm_rounds = 20) {
  constexpr size_t kChunk = 25;
  static std::vector<cudaEvent_t> starts, stops;
  while (starts.size() < kChunk) {
    starts.emplace_back();
    stops.emplace_back();
    check(cudaEventCreate(&starts.back()), "cudaEventCreate");
    check(cudaEventCreate(&stops.back()), "cudaEventCreate");
  }
  std::vector<std::vector<float>> times(variants);
  std::vector<int> order;  // the calls not yet made: variant indices
  std::mt19937 shuffle(seed);
  const size_t chunk = queued ? kChunk : 1;
  for (int round = 0; round < rounds; ++round) {
    std::vector<int> next(variants);
    for (size_t i = 0; i < next.size(); ++i) next[i] = static_cast<int>(i);
    std::shuffle(next.begin(), next.end(), shuffle);
    order.insert(order.end(), next.begin(), next.end());
    const bool last = round + 1 == rounds;
    while (order.size() >= chunk || (last && !order.empty())) {
      const size_t n = std::min(order.size(), chunk);
      if (queued) spin<<<1, 1>>>(2'000'000);  // about 1 ms at 2 GHz
      for (size_t i = 0; i < n; ++i) {
        check(flush_l2(flush, flush_bytes), "flush_l2");
        check(cudaEventRecord(starts[i]), "cudaEventRecord");
        call(order[i]);
        check(cudaEventRecord(stops[i]), "cudaEventRecord");
      }
      check(cudaEventSynchronize(stops[n - 1]), "cudaEventSynchronize");
      for (size_t i = 0; i < n; ++i) {
        float ms = 0;
        check(cudaEventElapsedTime(&ms, starts[i], stops[i]), "cudaEventElapsedTime");
        if (round >= warm_rounds) times[order[i]].push_back(ms * 1000);
      }
      order.erase(order.begin(), order.begin() + static_cast<long>(n));
    }
  }
  check(cudaGetLastError(), "a launch");
  return times;
}

// The mean of the middle half: a call after the flush takes one of two levels (see
// flush_alternation), so a median jumps between them where this moves smoothly.
inline double middle_half_mean(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  double sum = 0;
  for (size_t j = t.size() / 4; j < 3 * t.size() / 4; ++j) sum += t[j];
  return sum / static_cast<double>(3 * t.size() / 4 - t.size() / 4);
}

inline double median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The Evaluator the tuner measures candidates with, on one GPU: compile every candidate (in
// parallel, through the binary store), run each on scratch buffers, check its output
// against the reference config's, and time them all with CUDA events in interleaved rounds
// (each round runs every candidate once, in a shuffled order, each after an L2 flush; every
// candidate runs on the same buffers).
#pragma once

#include <atomic>
#include <cstdint>

#include "cache/binary_store.h"
#include "jit/device.h"
#include "tuner/evaluator.h"

namespace kiln::jit {

struct EvaluatorOptions {
  double warmup_ms = 1;  // GPU time spent running the candidates just before the timed rounds
  int min_repetitions = 10;
  // A kernel of a few microseconds jitters by a tenth of its time from run to run: its median
  // needs a few hundred samples to separate configs 3% apart (each costs microseconds).
  int max_repetitions = 200;
  // GPU time spent timing one candidate (its share of the rounds), beyond the minimum
  double budget_ms = 20;
  // About how many output elements a candidate's check reads back and compares (see
  // rows_to_check). 1031 rows of 14848-wide gated_adaln, 30 million outputs, took 200 ms a
  // candidate on the H200's host: most of a cold tune.
  std::int64_t verify_elements = std::int64_t{1} << 21;
};

// The rows a candidate's output is checked on against the reference's: the same kernel on
// fewer rows than are timed (fewer CTAs). Reading back and comparing every output of every
// candidate costs more than compiling and timing them. At most `rows` and 1031 rows, and about
// `verify_elements` outputs, but at least two rows per SM (odd), so a persistent grid of one
// CTA per SM still runs its grid-stride loop.
std::int64_t rows_to_check(const DeviceInfo& device, const Family& family, const Problem& problem,
                           std::int64_t rows, std::int64_t verify_elements);

class GpuEvaluator : public Evaluator {
 public:
  // `store` may be null (compile in memory); it must outlive the evaluator.
  GpuEvaluator(DeviceInfo device, BinaryStore* store, EvaluatorOptions options = {});

  // Failures of one candidate become its trial's status and message. Throws kiln::Error only
  // when nothing can be measured: scratch memory or a stream cannot be had, or the reference
  // config itself fails.
  std::vector<Trial> evaluate(const Family& family, const Problem& problem, std::int64_t rows,
                              const Config& reference,
                              const std::vector<Config>& candidates) override;

  // NVRTC compiles made and binaries found in the store, over this evaluator's life.
  std::uint64_t compiles() const { return compiles_; }
  std::uint64_t binary_hits() const { return binary_hits_; }

 private:
  DeviceInfo device_;
  BinaryStore* store_;
  EvaluatorOptions options_;
  std::atomic<std::uint64_t> compiles_{0}, binary_hits_{0};
};

}  // namespace kiln::jit

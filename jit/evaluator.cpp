#include "jit/evaluator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "cache/error.h"
#include "cache/log.h"
#include "jit/compiler.h"
#include "jit/device_memory.h"
#include "jit/driver.h"
#include "jit/l2_flush.h"
#include "jit/launch.h"
#include "jit/module.h"
#include "jit/verify.h"

namespace kiln::jit {
namespace {

// NVRTC is thread-safe across programs; compiling is most of a cold tune's time.
std::vector<Expected<CompiledKernel>> compile_each(const std::vector<CompileRequest>& requests,
                                                   BinaryStore* store) {
  std::vector<std::optional<Expected<CompiledKernel>>> slots(requests.size());
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < requests.size();) {
      try {
        slots[i].emplace(compile(requests[i], store));
      } catch (const std::exception& error) {
        slots[i].emplace(Error(std::string("kiln: compile failed: ") + error.what()));
      }
    }
  };
  const std::size_t workers =
      std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), requests.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < workers; ++i) {
    threads.emplace_back(work);
  }
  work();
  for (auto& thread : threads) {
    thread.join();
  }
  std::vector<Expected<CompiledKernel>> out;
  out.reserve(slots.size());
  for (auto& slot : slots) {
    out.push_back(std::move(*slot));
  }
  return out;
}

// Configs that differ only in launch geometry (a grid size, say) share one instantiation:
// each is compiled once, by its first config in order, and the rest reuse that binary with
// no compile time of their own. Compiling them side by side would race for the same store
// entry and spend NVRTC time twice.
std::vector<Expected<CompiledKernel>> compile_all(const std::vector<CompileRequest>& requests,
                                                  BinaryStore* store) {
  std::vector<CompileRequest> unique;
  std::vector<std::size_t> slot_of(requests.size());
  std::unordered_map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const CompileRequest& request = requests[i];
    const std::string name = request.family->name_expression(request.problem, request.config);
    const auto [it, inserted] = seen.emplace(name, unique.size());
    if (inserted) {
      unique.push_back(request);
    }
    slot_of[i] = it->second;
  }
  std::vector<Expected<CompiledKernel>> compiled = compile_each(unique, store);
  std::vector<bool> handed_out(unique.size(), false);
  std::vector<Expected<CompiledKernel>> out;
  out.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Expected<CompiledKernel> result = compiled[slot_of[i]];
    if (handed_out[slot_of[i]] && result) {
      result->compile_ms = 0;
      result->from_cache = true;
    }
    handed_out[slot_of[i]] = true;
    out.push_back(std::move(result));
  }
  return out;
}

// Wall time of the evaluation's phases, for the debug log: where a cold tune's time goes.
class PhaseClock {
 public:
  double lap_ms() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

std::uint32_t block_threads(const LaunchGeometry& geometry) {
  return geometry.block[0] * geometry.block[1] * geometry.block[2];
}

// The scratch buffers of one evaluation: inputs filled with fixed pseudo-random values,
// outputs poisoned (all bits set: NaN in every float dtype) before each checked run, so an
// element a kernel fails to write cannot pass as correct.
struct Scratch {
  // An odd count, so rows of any even width do not all see the same values.
  static constexpr std::int64_t kPatternElements = (1 << 20) + 7;

  std::vector<BufferSpec> specs;
  std::vector<DeviceBuffer> buffers;
  std::vector<std::byte> params;

  Scratch(const Family& family, const Problem& problem, std::int64_t rows) {
    specs = family.buffers(problem, rows);
    std::vector<std::uint64_t> addresses;
    Driver& d = driver();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const BufferSpec& spec = specs[i];
      buffers.emplace_back(static_cast<std::size_t>(spec.elements) * dtype_size(spec.dtype));
      addresses.push_back(buffers.back().address());
      if (!spec.is_output) {
        // A random block of at most kPatternElements, repeated: large inputs fill in
        // milliseconds instead of the seconds a host generator takes for 10^8 values.
        const std::int64_t pattern_elements = std::min(spec.elements, kPatternElements);
        const std::vector<char> values =
            random_values(spec.dtype, pattern_elements, 0x6B696C6E + i);
        for (std::size_t offset = 0; offset < buffers.back().bytes(); offset += values.size()) {
          const std::size_t bytes = std::min(values.size(), buffers.back().bytes() - offset);
          check(d.cuMemcpyHtoD(buffers.back().address() + offset, values.data(), bytes),
                "cuMemcpyHtoD", "filling input " + spec.name);
        }
      }
    }
    // A copy from pageable memory may return before its DMA lands, and the evaluator's
    // non-blocking stream does not wait on the default stream the copies ran on: without
    // this, a first launch could read inputs still being written.
    check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize", "filling the inputs");
    params = family.pack_params(problem, rows, addresses);
  }

  std::size_t bytes() const {
    std::size_t total = 0;
    for (const DeviceBuffer& buffer : buffers) {
      total += buffer.bytes();
    }
    return total;
  }

  void poison_outputs(CUstream stream) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].is_output) {
        continue;
      }
      check(driver().cuMemsetD8Async(buffers[i].address(), 0xFF, buffers[i].bytes(), stream),
            "cuMemsetD8Async", "poisoning output " + specs[i].name);
    }
  }

  // Copies the outputs into `out`, one vector each, reusing its storage: fresh host memory for
  // every candidate's megabytes cost as much as the copy.
  void read_outputs(std::vector<std::vector<char>>& out) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].is_output) {
        continue;
      }
      if (out.size() <= k) {
        out.emplace_back();
      }
      std::vector<char>& bytes = out[k++];
      bytes.resize(buffers[i].bytes());
      check(driver().cuMemcpyDtoH(bytes.data(), buffers[i].address(), bytes.size()), "cuMemcpyDtoH",
            "reading output " + specs[i].name);
    }
    out.resize(k);
  }

  // Why `got` differs from `expected`, output by output; empty when they agree.
  std::string mismatch(const std::vector<std::vector<char>>& got,
                       const std::vector<std::vector<char>>& expected) const {
    std::size_t k = 0;
    for (const auto& spec : specs) {
      if (!spec.is_output) {
        continue;
      }
      if (auto why = compare_outputs(spec.dtype, got[k], expected[k], spec.summed_terms)) {
        return spec.name + ": " + *why;
      }
      ++k;
    }
    return {};
  }
};

// A candidate that compiled, loaded and gave the reference output: ready to be timed.
struct Runnable {
  std::size_t trial;  // its index among the evaluation's trials
  CUfunction function = nullptr;
  LaunchGeometry geometry;
};

class Measurement {
 public:
  Measurement(const DeviceInfo& device, const Family& family, const Problem& problem,
              std::int64_t rows, const EvaluatorOptions& options)
      : device_(device),
        family_(family),
        problem_(problem),
        rows_(rows),
        options_(options),
        verify_rows_(rows_to_check(device, family, problem, rows, options.verify_elements)),
        verify_(family, problem, verify_rows_),
        scratch_(family, problem, rows),
        // Twice the L2, read and written between repetitions, so every run starts with cold
        // caches (as a real model's op does, its input having been evicted by the layers
        // between). See l2_flush.h for why the candidates' buffers are lowered and the
        // flush's read first.
        flush_(device,
               static_cast<std::size_t>(std::max<std::int64_t>(device.l2_bytes, 1 << 20)) * 2,
               regions_of({&verify_, &scratch_})) {}

  // Loads and runs the reference config, keeping its outputs.
  void run_reference(const Config& config, const Expected<CompiledKernel>& compiled) {
    const std::string where = "kiln evaluator: the reference config " + config.key() + " of " +
                              problem_.key() + " on device " + std::to_string(device_.ordinal);
    if (!compiled) {
      throw Error(where + " did not compile: " + compiled.error().message(),
                  compiled.error().log());
    }
    try {
      const LaunchGeometry geometry = family_.geometry(problem_, config, verify_rows_);
      const LoadedKernel kernel =
          load_kernel(device_.ordinal, compiled.value(), geometry.smem_bytes);
      run_checked(kernel.function, geometry);
      verify_.read_outputs(reference_);
      const std::string self = verify_.mismatch(reference_, reference_);
      if (!self.empty()) {
        throw Error("its output has NaN or unwritten elements: " + self);
      }
    } catch (const Error& error) {
      throw Error(where + " failed: " + error.message(), error.log());
    }
  }

  // Loads a candidate and checks its output. A candidate that passes is returned to be timed
  // (its trial stays `ok` with no time yet); one that fails says why in its trial.
  std::optional<Runnable> admit(std::size_t index, const Config& config,
                                const Expected<CompiledKernel>& compiled, Trial& trial) {
    trial.config = config;
    if (!compiled) {
      trial.status = TrialStatus::compile_error;
      trial.message = compiled.error().what();
      return std::nullopt;
    }
    trial.compile_ms = compiled->compile_ms;
    trial.status = TrialStatus::launch_error;  // until it has run
    try {
      const LaunchGeometry geometry = family_.geometry(problem_, config, rows_);
      const LoadedKernel kernel =
          load_kernel(device_.ordinal, compiled.value(), geometry.smem_bytes);
      if (const std::string why = resource_problem(kernel, geometry, config); !why.empty()) {
        trial.status = TrialStatus::resource_error;
        trial.message = why;
        return std::nullopt;
      }
      run_checked(kernel.function, family_.geometry(problem_, config, verify_rows_));
      verify_.read_outputs(outputs_);
      if (const std::string why = verify_.mismatch(outputs_, reference_); !why.empty()) {
        trial.status = TrialStatus::wrong_result;
        trial.message = why;
        return std::nullopt;
      }
      trial.status = TrialStatus::ok;
      return Runnable{index, kernel.function, geometry};
    } catch (const std::exception& error) {
      trial.message = error.what();
      return std::nullopt;
    }
  }

  // Times every runnable candidate in interleaved rounds: each round runs all of them once, in
  // a fresh shuffled order, each after an L2 flush. Timing the candidates one after another
  // instead biased them by position: the time of a microsecond kernel after a flush alternates
  // from one repetition to the next (on H100 and H200 alike), and with it the level a whole
  // run of repetitions settles at, so identical launches measured 10% apart depending on
  // whether an odd or even number of flushes came before them. Shuffled rounds give every
  // candidate the same mix of those states, and of any clock drift over the tune.
  void time_all(const std::vector<Runnable>& runnables, std::vector<Trial>& trials) {
    const std::size_t n = runnables.size();
    if (n == 0) {
      return;
    }
    std::vector<bool> failed(n, false);
    std::vector<std::vector<double>> samples(n);
    RoundEvents rounds[2] = {RoundEvents(n), RoundEvents(n)};

    // One flushed run of each, to size the warm-up and the number of rounds.
    Event round_start;
    record(round_start);
    run_round(runnables, identity_order(n), rounds[0], failed, trials);
    stream_.synchronize("sizing the candidates' timing");
    double sum_us = 0;
    std::size_t sized = 0;
    for (std::size_t k = 0; k < n; ++k) {
      if (failed[k]) {
        continue;
      }
      sum_us += std::max(elapsed_us(rounds[0].starts[k], rounds[0].ends[k]), 1.0);
      ++sized;
    }
    if (sized == 0) {
      return;
    }
    const double round_us = std::max(elapsed_us(round_start, *rounds[0].last_recorded), 1.0);
    const int count =
        std::clamp(static_cast<int>(options_.budget_ms * 1e3 * static_cast<double>(sized) / sum_us),
                   options_.min_repetitions, options_.max_repetitions);

    // The GPU idled while the host loaded and checked the candidates: keep it busy for
    // warmup_ms before sampling, so the clocks have settled.
    const int warm_rounds =
        std::clamp(static_cast<int>(options_.warmup_ms * 1e3 / round_us), 1, kMaxWarmRounds);
    for (int w = 0; w < warm_rounds; ++w) {
      for (std::size_t k = 0; k < n; ++k) {
        if (failed[k]) {
          continue;
        }
        flush_l2();
        failed[k] = !launch_timed(runnables[k], nullptr, nullptr, trials[runnables[k].trial]);
      }
    }

    // Rounds are recorded into two alternating sets of events: the host reads one round's
    // times while the GPU runs the next, so the stream never drains between rounds.
    std::mt19937 shuffler(kShuffleSeed);
    std::vector<std::size_t> order = identity_order(n);
    for (int r = 0; r <= count; ++r) {
      if (r < count) {
        std::shuffle(order.begin(), order.end(), shuffler);
        run_round(runnables, order, rounds[r % 2], failed, trials);
      }
      if (r > 0) {
        const RoundEvents& done = rounds[(r - 1) % 2];
        if (done.last_recorded) {
          done.last_recorded->synchronize("timing the candidates");
        }
        for (std::size_t k = 0; k < n; ++k) {
          if (!failed[k]) {
            samples[k].push_back(elapsed_us(done.starts[k], done.ends[k]));
          }
        }
      }
    }
    for (std::size_t k = 0; k < n; ++k) {
      if (failed[k]) {
        continue;
      }
      Trial& trial = trials[runnables[k].trial];
      const TimingSummary summary = summarize(samples[k]);
      trial.median_us = summary.median_us;
      trial.spread_us = summary.spread_us;
      trial.repetitions = static_cast<int>(samples[k].size());
    }
  }

 private:
  struct RoundEvents {
    explicit RoundEvents(std::size_t n) : starts(n), ends(n) {}
    std::vector<Event> starts, ends;
    const Event* last_recorded = nullptr;  // the round's last event: the round is done after it
  };

  static std::vector<L2Region> regions_of(std::initializer_list<const Scratch*> scratches) {
    std::vector<L2Region> regions;
    for (const Scratch* scratch : scratches) {
      for (const DeviceBuffer& buffer : scratch->buffers) {
        regions.push_back({buffer.address(), buffer.bytes()});
      }
    }
    return regions;
  }

  static std::vector<std::size_t> identity_order(std::size_t n) {
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    return order;
  }

  void run_round(const std::vector<Runnable>& runnables, const std::vector<std::size_t>& order,
                 RoundEvents& events, std::vector<bool>& failed, std::vector<Trial>& trials) {
    for (const std::size_t k : order) {
      if (failed[k]) {
        continue;
      }
      flush_l2();
      failed[k] = !launch_timed(runnables[k], &events.starts[k], &events.ends[k],
                                trials[runnables[k].trial]);
      if (!failed[k]) {
        events.last_recorded = &events.ends[k];
      }
    }
  }

  // A launch that fails while timing fails only its own candidate (false, and its trial says
  // why).
  bool launch_timed(const Runnable& runnable, const Event* start, const Event* end, Trial& trial) {
    try {
      if (start) {
        record(*start);
      }
      launch_kernel(device_.ordinal, runnable.function, runnable.geometry, scratch_.params.data(),
                    stream_.get());
      if (end) {
        record(*end);
      }
      return true;
    } catch (const std::exception& error) {
      trial.status = TrialStatus::launch_error;
      trial.message = error.what();
      return false;
    }
  }

  void record(const Event& event) {
    check(driver().cuEventRecord(event.get(), stream_.get()), "cuEventRecord", "timing");
  }

  std::string resource_problem(const LoadedKernel& kernel, const LaunchGeometry& geometry,
                               const Config& config) const {
    const std::uint32_t threads = block_threads(geometry);
    if (kernel.max_threads_per_block < static_cast<int>(threads) ||
        kernel.max_threads_per_block < config.cta_threads) {
      return "the compiled kernel allows at most " + std::to_string(kernel.max_threads_per_block) +
             " threads per block (" + std::to_string(kernel.registers) +
             " registers per thread), the config launches " + std::to_string(threads);
    }
    if (std::int64_t{geometry.smem_bytes} + kernel.static_smem_bytes >
        device_.smem_per_block_optin) {
      return "needs " + std::to_string(geometry.smem_bytes) + " bytes of dynamic and " +
             std::to_string(kernel.static_smem_bytes) +
             " of static shared memory, the device allows " +
             std::to_string(device_.smem_per_block_optin) + " in all";
    }
    return {};
  }

  void run_checked(CUfunction function, const LaunchGeometry& geometry) {
    verify_.poison_outputs(stream_.get());
    launch_kernel(device_.ordinal, function, geometry, verify_.params.data(), stream_.get());
    stream_.synchronize("running a candidate once");
  }

  void flush_l2() { flush_.run(stream_.get()); }

  static double elapsed_us(const Event& start, const Event& end) {
    float ms = 0;
    check(driver().cuEventElapsedTime(&ms, start.get(), end.get()), "cuEventElapsedTime", "timing");
    return static_cast<double>(ms) * 1e3;
  }

  const DeviceInfo& device_;
  const Family& family_;
  const Problem& problem_;
  std::int64_t rows_;
  const EvaluatorOptions& options_;
  Stream stream_;
  static constexpr int kMaxWarmRounds = 1000;
  // Fixed, so two tunes of the same candidates time them in the same orders.
  static constexpr std::uint32_t kShuffleSeed = 0x6B696C6E;
  std::int64_t verify_rows_;
  Scratch verify_;
  // Every timed launch runs on these same buffers, as a model's op runs on tensors the layers
  // before it just touched and as the benches time every contender. Taking turns over four
  // sets instead (for problems that fit in L2) added up to 1.8 us to a launch of a 44 MB
  // problem, more to some configs than others: an H200's full tune of rms_norm 2688 x 4096
  // timed its 8 best configs 16.2-16.4 us where, pinned side by side, they ran 14.5-16.3 us,
  // and it ranked them otherwise.
  Scratch scratch_;
  L2Flush flush_;
  std::vector<std::vector<char>> reference_;
  std::vector<std::vector<char>> outputs_;  // the candidate's being checked
};

}  // namespace

std::int64_t rows_to_check(const DeviceInfo& device, const Family& family, const Problem& problem,
                           std::int64_t rows, std::int64_t verify_elements) {
  constexpr std::int64_t kMaxRows = 1031;
  std::int64_t per_row = 0;
  for (const BufferSpec& spec : family.buffers(problem, 1)) {
    per_row += spec.is_output ? spec.elements : 0;
  }
  const std::int64_t floor = std::min<std::int64_t>(2 * device.sm_count + 1, kMaxRows);
  const std::int64_t by_elements = verify_elements / std::max<std::int64_t>(per_row, 1);
  return std::min(rows, std::clamp(by_elements, floor, kMaxRows));
}

GpuEvaluator::GpuEvaluator(DeviceInfo device, BinaryStore* store, EvaluatorOptions options)
    : device_(std::move(device)), store_(store), options_(options) {
  options_.min_repetitions = std::max(options_.min_repetitions, 1);
  options_.max_repetitions = std::max(options_.max_repetitions, options_.min_repetitions);
}

std::vector<Trial> GpuEvaluator::evaluate(const Family& family, const Problem& problem,
                                          std::int64_t rows, const Config& reference,
                                          const std::vector<Config>& candidates) {
  PhaseClock clock;
  std::vector<CompileRequest> requests;
  requests.reserve(candidates.size() + 1);
  for (const Config& config : candidates) {
    requests.push_back({&family, problem, config, device_.sm(), BinaryFormat::cubin});
  }
  requests.push_back({&family, problem, reference, device_.sm(), BinaryFormat::cubin});
  // The scratch buffers are allocated and filled while NVRTC compiles (which needs no
  // context): for large problems that is up to a fifth of a second a round.
  std::future<std::vector<Expected<CompiledKernel>>> compiling =
      std::async(std::launch::async, [&] { return compile_all(requests, store_); });

  // Everything on the GPU happens in the device's primary context, on a private stream;
  // the handles below are released (in reverse order) before the context is popped.
  ScopedContext context(device_.ordinal);
  Measurement measurement(device_, family, problem, rows, options_);
  const double buffers_ms = clock.lap_ms();
  const std::vector<Expected<CompiledKernel>> compiled = compiling.get();
  const std::uint64_t compiles_before = compiles_;
  for (const auto& result : compiled) {
    if (!result) {
      continue;
    }
    ++(result->from_cache ? binary_hits_ : compiles_);
  }
  const double compile_ms = buffers_ms + clock.lap_ms();
  measurement.run_reference(reference, compiled.back());
  std::vector<Trial> trials(candidates.size());
  std::vector<Runnable> runnables;
  runnables.reserve(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (auto runnable = measurement.admit(i, candidates[i], compiled[i], trials[i])) {
      runnables.push_back(*runnable);
    }
  }
  const double check_ms = clock.lap_ms();
  measurement.time_all(runnables, trials);
  if (log::level() >= log::Level::debug) {
    char line[256];
    std::snprintf(line, sizeof line,
                  ": %zu candidates; compile %.0f ms (%llu compiled; buffers meanwhile %.0f ms), "
                  "load and check %.0f ms, timing %.0f ms",
                  candidates.size(), compile_ms,
                  static_cast<unsigned long long>(compiles_ - compiles_before), buffers_ms,
                  check_ms, clock.lap_ms());
    log::debug("kiln evaluator: " + problem.key() + " x" + std::to_string(rows) + line);
  }
  return trials;
}

}  // namespace kiln::jit

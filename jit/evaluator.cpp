#include "jit/evaluator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <thread>
#include <unordered_map>

#include "cache/error.h"
#include "jit/compiler.h"
#include "jit/device_memory.h"
#include "jit/driver.h"
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
  for (std::size_t i = 1; i < workers; ++i) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  std::vector<Expected<CompiledKernel>> out;
  out.reserve(slots.size());
  for (auto& slot : slots) out.push_back(std::move(*slot));
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
    if (inserted) unique.push_back(request);
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
    params = family.pack_params(problem, rows, addresses);
  }

  void poison_outputs(CUstream stream) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].is_output) continue;
      check(driver().cuMemsetD8Async(buffers[i].address(), 0xFF, buffers[i].bytes(), stream),
            "cuMemsetD8Async", "poisoning output " + specs[i].name);
    }
  }

  std::vector<std::vector<char>> read_outputs() {
    std::vector<std::vector<char>> out;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].is_output) continue;
      std::vector<char> bytes(buffers[i].bytes());
      check(driver().cuMemcpyDtoH(bytes.data(), buffers[i].address(), bytes.size()), "cuMemcpyDtoH",
            "reading output " + specs[i].name);
      out.push_back(std::move(bytes));
    }
    return out;
  }

  // Why `got` differs from `expected`, output by output; empty when they agree.
  std::string mismatch(const std::vector<std::vector<char>>& got,
                       const std::vector<std::vector<char>>& expected) const {
    std::size_t k = 0;
    for (const auto& spec : specs) {
      if (!spec.is_output) continue;
      if (auto why = compare_outputs(spec.dtype, got[k], expected[k]))
        return spec.name + ": " + *why;
      ++k;
    }
    return {};
  }
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
        verify_rows_(std::min(rows, kVerifyRows)),
        verify_(family, problem, verify_rows_),
        scratch_(family, problem, rows),
        // Twice the L2, written between repetitions, so every run starts with cold caches
        // (as a real model's op does, its input having been evicted by the layers between).
        flush_(static_cast<std::size_t>(std::max<std::int64_t>(device.l2_bytes, 1 << 20)) * 2) {
    // At least two: the sizing run times the flush and the launch apart.
    for (int i = 0; i < std::max(options.max_repetitions, 2); ++i) {
      starts_.emplace_back();
      ends_.emplace_back();
    }
  }

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
      reference_ = verify_.read_outputs();
      const std::string self = verify_.mismatch(reference_, reference_);
      if (!self.empty()) throw Error("its output has NaN or unwritten elements: " + self);
    } catch (const Error& error) {
      throw Error(where + " failed: " + error.message(), error.log());
    }
  }

  Trial measure(const Config& config, const Expected<CompiledKernel>& compiled) {
    Trial trial;
    trial.config = config;
    if (!compiled) {
      trial.status = TrialStatus::compile_error;
      trial.message = compiled.error().what();
      return trial;
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
        return trial;
      }
      run_checked(kernel.function, family_.geometry(problem_, config, verify_rows_));
      if (const std::string why = verify_.mismatch(verify_.read_outputs(), reference_);
          !why.empty()) {
        trial.status = TrialStatus::wrong_result;
        trial.message = why;
        return trial;
      }
      const std::vector<double> samples = time(kernel.function, geometry);
      const TimingSummary summary = summarize(samples);
      trial.status = TrialStatus::ok;
      trial.median_us = summary.median_us;
      trial.spread_us = summary.spread_us;
      trial.repetitions = static_cast<int>(samples.size());
    } catch (const std::exception& error) {
      trial.message = error.what();
    }
    return trial;
  }

 private:
  std::string resource_problem(const LoadedKernel& kernel, const LaunchGeometry& geometry,
                               const Config& config) const {
    const std::uint32_t threads = block_threads(geometry);
    if (kernel.max_threads_per_block < static_cast<int>(threads) ||
        kernel.max_threads_per_block < config.cta_threads) {
      return "the compiled kernel allows at most " + std::to_string(kernel.max_threads_per_block) +
             " threads per block (" + std::to_string(kernel.registers) +
             " registers per thread), the config launches " + std::to_string(threads);
    }
    if (geometry.smem_bytes > device_.smem_per_block_optin) {
      return "needs " + std::to_string(geometry.smem_bytes) +
             " bytes of dynamic shared memory, the device allows " +
             std::to_string(device_.smem_per_block_optin);
    }
    return {};
  }

  void launch(CUfunction function, const LaunchGeometry& geometry) {
    launch_kernel(device_.ordinal, function, geometry, scratch_.params.data(), stream_.get());
  }

  void run_checked(CUfunction function, const LaunchGeometry& geometry) {
    verify_.poison_outputs(stream_.get());
    launch_kernel(device_.ordinal, function, geometry, verify_.params.data(), stream_.get());
    stream_.synchronize("running a candidate once");
  }

  void flush_l2() {
    check(driver().cuMemsetD8Async(flush_.address(), 0, flush_.bytes(), stream_.get()),
          "cuMemsetD8Async", "flushing L2");
  }

  double elapsed_us(const Event& start, const Event& end) {
    float ms = 0;
    check(driver().cuEventElapsedTime(&ms, start.get(), end.get()), "cuEventElapsedTime", "timing");
    return static_cast<double>(ms) * 1e3;
  }

  std::vector<double> time(CUfunction function, const LaunchGeometry& geometry) {
    Driver& d = driver();
    for (int i = 0; i < options_.warmup_runs; ++i) launch(function, geometry);
    // One timed run, L2 flush included, to size the warm-up and the repetitions.
    check(d.cuEventRecord(starts_[0].get(), stream_.get()), "cuEventRecord", "timing");
    flush_l2();
    check(d.cuEventRecord(starts_[1].get(), stream_.get()), "cuEventRecord", "timing");
    launch(function, geometry);
    check(d.cuEventRecord(ends_[0].get(), stream_.get()), "cuEventRecord", "timing");
    stream_.synchronize("timing a candidate");
    const double estimate_us = std::max(elapsed_us(starts_[1], ends_[0]), 1.0);
    const double iteration_us = std::max(elapsed_us(starts_[0], ends_[0]), 1.0);
    const int repetitions = std::clamp(static_cast<int>(options_.budget_ms * 1e3 / estimate_us),
                                       options_.min_repetitions, options_.max_repetitions);

    // The GPU idled while the host waited above (and for the module load and the read-back
    // before it): keep it busy for warmup_ms before sampling, so that every candidate is timed
    // at the same clocks whatever came before it. Without this, two identical launches of a
    // microsecond kernel measured 10% apart, always in the same order.
    const int warm_runs =
        std::clamp(static_cast<int>(options_.warmup_ms * 1e3 / iteration_us), 1, kMaxWarmRuns);
    for (int r = 0; r < warm_runs; ++r) {
      flush_l2();
      launch(function, geometry);
    }

    for (int r = 0; r < repetitions; ++r) {
      flush_l2();
      check(d.cuEventRecord(starts_[r].get(), stream_.get()), "cuEventRecord", "timing");
      launch(function, geometry);
      check(d.cuEventRecord(ends_[r].get(), stream_.get()), "cuEventRecord", "timing");
    }
    stream_.synchronize("timing a candidate");
    std::vector<double> samples;
    for (int r = 0; r < repetitions; ++r) samples.push_back(elapsed_us(starts_[r], ends_[r]));
    return samples;
  }

  const DeviceInfo& device_;
  const Family& family_;
  const Problem& problem_;
  std::int64_t rows_;
  const EvaluatorOptions& options_;
  Stream stream_;
  // Correctness is checked on at most kVerifyRows rows (the same kernel, fewer CTAs): reading
  // back and comparing 10^8 outputs per candidate would cost seconds. Timing uses all rows.
  static constexpr std::int64_t kVerifyRows = 1031;
  static constexpr int kMaxWarmRuns = 1000;
  std::int64_t verify_rows_;
  Scratch verify_;
  Scratch scratch_;
  DeviceBuffer flush_;
  std::vector<Event> starts_, ends_;
  std::vector<std::vector<char>> reference_;
};

}  // namespace

GpuEvaluator::GpuEvaluator(DeviceInfo device, BinaryStore* store, EvaluatorOptions options)
    : device_(std::move(device)), store_(store), options_(options) {
  options_.min_repetitions = std::max(options_.min_repetitions, 1);
  options_.max_repetitions = std::max(options_.max_repetitions, options_.min_repetitions);
}

std::vector<Trial> GpuEvaluator::evaluate(const Family& family, const Problem& problem,
                                          std::int64_t rows, const Config& reference,
                                          const std::vector<Config>& candidates) {
  std::vector<CompileRequest> requests;
  for (const Config& config : candidates) {
    requests.push_back({&family, problem, config, device_.sm(), BinaryFormat::cubin});
  }
  requests.push_back({&family, problem, reference, device_.sm(), BinaryFormat::cubin});
  const std::vector<Expected<CompiledKernel>> compiled = compile_all(requests, store_);
  for (const auto& result : compiled) {
    if (!result) continue;
    ++(result->from_cache ? binary_hits_ : compiles_);
  }

  // Everything on the GPU happens in the device's primary context, on a private stream;
  // the handles below are released (in reverse order) before the context is popped.
  ScopedContext context(device_.ordinal);
  Measurement measurement(device_, family, problem, rows, options_);
  measurement.run_reference(reference, compiled.back());
  std::vector<Trial> trials;
  trials.reserve(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    trials.push_back(measurement.measure(candidates[i], compiled[i]));
  }
  return trials;
}

}  // namespace kiln::jit

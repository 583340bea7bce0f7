// The GPU half of jit/: probing, loading, launching, evaluating, the runtime's resolve paths
// and graph capture. Each case says it was skipped (and passes) on a machine with no GPU.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cache/binary_store.h"
#include "cache/error.h"
#include "cache/tuning_db.h"
#include "jit/compiler.h"
#include "jit/copy_bandwidth.h"
#include "jit/device_memory.h"
#include "jit/device_probe.h"
#include "jit/driver.h"
#include "jit/evaluator.h"
#include "jit/host_float.h"
#include "jit/module.h"
#include "jit/runtime.h"
#include "jit/verify.h"
#include "jit_test_support.h"
#include "templates/rms_norm_family.h"

namespace kiln::jit {

using test::contains;
using test::ScratchDir;

namespace {

bool have_gpu() {
  try {
    return device_count() > 0;
  } catch (const Error& error) {
    MESSAGE("skipped, no GPU: " << error.message());
    return false;
  }
}

std::uint32_t row_align(DType dtype, std::int64_t hidden) {
  std::uint32_t align = 16;
  const auto bytes = static_cast<std::uint64_t>(hidden) * dtype_size(dtype);
  while (bytes % align != 0) align /= 2;
  return align;
}

Problem rms_problem(DType dtype, bool weight, std::int64_t hidden) {
  return Problem{Op::rms_norm, dtype, hidden, weight ? kRmsNormHasWeight : 0u,
                 row_align(dtype, hidden)};
}

std::vector<char> to_dtype(DType dtype, const std::vector<double>& values) {
  std::vector<char> bytes(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto value = static_cast<float>(values[i]);
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    } else {
      const std::uint16_t bits =
          dtype == DType::f16 ? float_to_f16_bits(value) : float_to_bf16_bits(value);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

// Runs `launch(params)` on scratch buffers of the family's layout and checks the output
// against RMSNorm computed on the host in double precision.
template <typename Launch>
void check_rms_norm_on_gpu(const Problem& problem, std::int64_t rows, Launch&& launch) {
  const Family& fam = family(Op::rms_norm);
  const std::vector<BufferSpec> specs = fam.buffers(problem, rows);
  std::vector<DeviceBuffer> buffers;
  std::vector<std::vector<char>> host;
  std::vector<std::uint64_t> addresses;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    host.push_back(random_values(specs[i].dtype, specs[i].elements, 99 + i));
    buffers.emplace_back(host.back().size());
    addresses.push_back(buffers.back().address());
    check(driver().cuMemcpyHtoD(addresses.back(), host.back().data(), host.back().size()),
          "cuMemcpyHtoD", "test input");
  }
  // The copies' DMA may still run when a pageable cuMemcpyHtoD returns, and the test's
  // stream is non-blocking: wait for the default stream they ran on.
  check(driver().cuStreamSynchronize(nullptr), "cuStreamSynchronize", "test input");
  const std::vector<std::byte> params = fam.pack_params(problem, rows, addresses);
  launch(params.data());

  std::vector<char> got(buffers.back().bytes());
  check(driver().cuMemcpyDtoH(got.data(), buffers.back().address(), got.size()), "cuMemcpyDtoH",
        "test output");
  const bool weighted = (problem.flags & kRmsNormHasWeight) != 0;
  std::vector<double> expected(static_cast<std::size_t>(rows * problem.hidden));
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (std::int64_t i = 0; i < problem.hidden; ++i) {
      const double x = element(problem.dtype, host[0], r * problem.hidden + i);
      sum += x * x;
    }
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(problem.hidden) +
                                         static_cast<double>(RmsNormFamily::kDefaultEps));
    for (std::int64_t i = 0; i < problem.hidden; ++i) {
      const double w = weighted ? element(problem.dtype, host[1], i) : 1.0;
      expected[static_cast<std::size_t>(r * problem.hidden + i)] =
          element(problem.dtype, host[0], r * problem.hidden + i) * scale * w;
    }
  }
  const auto why = compare_outputs(problem.dtype, got, to_dtype(problem.dtype, expected));
  CHECK_MESSAGE(!why, problem.key() << ": " << why.value_or(""));
}

Settings test_settings(const std::filesystem::path& dir, TuneMode tune) {
  Settings settings;
  settings.cache_dir = dir;
  settings.cache_mode = CacheMode::rw;
  settings.tune_mode = tune;
  return settings;
}

}  // namespace

TEST_CASE("GPU: the probe describes device 0") {
  if (!have_gpu()) return;
  const DeviceInfo info = probe_device(0);
  MESSAGE(info.name << " sm_" << info.sm() << " " << info.sm_count << " SMs, "
                    << info.datasheet_bandwidth_gbs() << " GB/s, " << info.fingerprint());
  CHECK_FALSE(info.name.empty());
  CHECK(info.sm() >= 75);
  CHECK(info.sm_count > 0);
  CHECK(info.memory_bytes > (1ll << 30));
  CHECK(info.l2_bytes > 0);
  CHECK(info.max_threads_per_block >= 1024);
  CHECK(info.smem_per_block_optin >= info.smem_per_block);
  CHECK(info.datasheet_bandwidth_gbs() > 100);
  CHECK(info.driver_version >= 12000);
  CHECK(contains(info.fingerprint(), ".sm" + std::to_string(info.sm()) + "."));
  CHECK_THROWS_AS(probe_device(device_count()), Error);
}

TEST_CASE("GPU: the copy bandwidth measures as a fraction of the datasheet's, repeatably") {
  if (!have_gpu()) return;
  const DeviceInfo info = probe_device(0);
  const auto first = measure_copy_bandwidth_gbs(info);
  const auto second = measure_copy_bandwidth_gbs(info);
  REQUIRE(first);
  REQUIRE(second);
  MESSAGE("copy " << *first << " and " << *second << " GB/s");
  CHECK(*first > 0.3 * info.datasheet_bandwidth_gbs());
  CHECK(std::abs(*first - *second) < 0.1 * *first);
}

TEST_CASE("GPU: heuristic kernels of every specialisation class compute RMSNorm") {
  if (!have_gpu()) return;
  ScratchDir dir;
  Runtime& runtime = Runtime::get();
  runtime.set_settings(test_settings(dir.path(), TuneMode::off));
  ScopedContext context(0);
  Stream stream;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool weight : {true, false}) {
      for (std::int64_t hidden : {4096, 4545, 768}) {
        const Problem problem = rms_problem(dtype, weight, hidden);
        CAPTURE(problem.key());
        const std::int64_t rows = 37;
        const Kernel& kernel = runtime.kernel(0, problem, rows, stream.get());
        CHECK(kernel.heuristic_only);
        CHECK(kernel.function != nullptr);
        check_rms_norm_on_gpu(problem, rows, [&](const void* params) {
          runtime.launch(kernel, rows, params, stream.get());
          stream.synchronize("test");
        });
      }
    }
  }
}

TEST_CASE("GPU: the evaluator measures the whole space of a problem") {
  if (!have_gpu()) return;
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const DeviceInfo info = probe_device(0);
  GpuEvaluator evaluator(info, &store);
  const Family& fam = family(Op::rms_norm);
  for (const Problem& problem :
       {rms_problem(DType::bf16, true, 4096), rms_problem(DType::f16, false, 4545)}) {
    CAPTURE(problem.key());
    const std::vector<Config> space = fam.space(problem, info.traits());
    const std::vector<Trial> trials =
        evaluator.evaluate(fam, problem, 2048, fam.heuristic(problem, info.traits()), space);
    REQUIRE(trials.size() == space.size());
    int ok = 0;
    std::set<std::string> compiled;  // configs differing only in launch geometry share a binary
    for (std::size_t i = 0; i < trials.size(); ++i) {
      CAPTURE(trials[i].config.key());
      const bool first_of_its_binary =
          compiled.insert(fam.name_expression(problem, trials[i].config)).second;
      CHECK(trials[i].config == space[i]);
      CHECK_MESSAGE(trials[i].status == TrialStatus::ok, trial_status_name(trials[i].status)
                                                             << ": " << trials[i].message);
      if (trials[i].status != TrialStatus::ok) continue;
      ++ok;
      CHECK(trials[i].median_us > 0);
      CHECK(trials[i].spread_us >= 0);
      CHECK(trials[i].repetitions >= 10);
      CHECK((first_of_its_binary ? trials[i].compile_ms > 0 : trials[i].compile_ms == 0));
    }
    MESSAGE(problem.key() << ": " << ok << " of " << trials.size() << " configs ok");
  }
  CHECK(evaluator.compiles() > 0);
  // A second evaluation finds every binary in the store.
  const Problem problem = rms_problem(DType::bf16, true, 4096);
  const std::vector<Config> one = {fam.heuristic(problem, info.traits())};
  const std::vector<Trial> again = evaluator.evaluate(fam, problem, 256, one[0], one);
  CHECK(again.at(0).status == TrialStatus::ok);
  CHECK(again.at(0).compile_ms == 0);
  CHECK(evaluator.binary_hits() >= 2);
}

TEST_CASE("GPU: the runtime tunes once, stores it, and later resolves from disk") {
  if (!have_gpu()) return;
  ScratchDir dir;
  Runtime& runtime = Runtime::get();
  runtime.set_settings(test_settings(dir.path(), TuneMode::fast));
  ScopedContext context(0);
  Stream stream;
  const Problem problem = rms_problem(DType::bf16, true, 3072);
  const std::int64_t rows = 3000;  // bucket 4096

  const RuntimeStats before = runtime.stats();
  const Kernel& tuned = runtime.kernel(0, problem, rows, stream.get());
  const RuntimeStats after_tune = runtime.stats();
  CHECK(after_tune.tunes == before.tunes + 1);
  CHECK(after_tune.resolves == before.resolves + 1);
  CHECK(after_tune.compiles > before.compiles);
  CHECK_FALSE(tuned.heuristic_only);
  check_rms_norm_on_gpu(problem, rows, [&](const void* params) {
    runtime.launch(tuned, rows, params, stream.get());
    stream.synchronize("test");
  });

  const DeviceInfo& info = runtime.device(0);
  TuningDb db(dir.path(), CacheMode::rw);
  const auto document = db.load(info.fingerprint(), problem.key(), 4096);
  REQUIRE(document);
  CHECK(document->at("winner").get<Config>() == tuned.config);
  CHECK(document->at("versions").contains("nvrtc"));
  CHECK(document->at("device").at("fingerprint") == info.fingerprint());
  // The report's ceiling: a measured copy, below the datasheet and well above nothing.
  REQUIRE(document->at("device").contains("copy_bandwidth_gbs"));
  const double copy_gbs = document->at("device").at("copy_bandwidth_gbs").get<double>();
  MESSAGE("copy bandwidth " << copy_gbs << " GB/s of " << info.datasheet_bandwidth_gbs()
                            << " datasheet");
  CHECK(copy_gbs > 0.3 * info.datasheet_bandwidth_gbs());
  CHECK(copy_gbs < 1.05 * info.datasheet_bandwidth_gbs());
  MESSAGE("tuned " << problem.key() << ": " << document->at("reason").get<std::string>());

  // Same bucket: a hot hit, the same kernel object.
  CHECK(&runtime.kernel(0, problem, 2100, stream.get()) == &tuned);
  CHECK(runtime.stats().hot_hits == after_tune.hot_hits + 1);

  // The host cost of a hit and of a launch (the design's budget is about 1 us per call).
  constexpr int kCalls = 20000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) runtime.kernel(0, problem, rows, stream.get());
  const auto lookups = std::chrono::steady_clock::now();
  std::vector<DeviceBuffer> scratch;
  std::vector<std::uint64_t> addresses;
  for (const BufferSpec& spec : family(Op::rms_norm).buffers(problem, 1)) {
    scratch.emplace_back(static_cast<std::size_t>(spec.elements) * dtype_size(spec.dtype));
    addresses.push_back(scratch.back().address());
  }
  const auto params = family(Op::rms_norm).pack_params(problem, 1, addresses);
  const auto launches_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) runtime.launch(tuned, 1, params.data(), stream.get());
  const auto launches = std::chrono::steady_clock::now();
  stream.synchronize("test");
  const double lookup_us =
      std::chrono::duration<double, std::micro>(lookups - start).count() / kCalls;
  const double launch_us =
      std::chrono::duration<double, std::micro>(launches - launches_start).count() / kCalls;
  MESSAGE("host time per hit: " << lookup_us << " us, per launch: " << launch_us << " us");
  CHECK(lookup_us < 5);

  // As a new process would: from the tuning db and the binary store, no tune, no compile.
  runtime.forget_kernels();
  const Kernel& warm = runtime.kernel(0, problem, rows, stream.get());
  const RuntimeStats after_warm = runtime.stats();
  CHECK(after_warm.tunes == after_tune.tunes);
  CHECK(after_warm.tuning_hits == after_tune.tuning_hits + 1);
  CHECK(after_warm.binary_hits == after_tune.binary_hits + 1);
  CHECK(after_warm.compiles == after_tune.compiles);
  CHECK(warm.config == tuned.config);
  CHECK(warm.binary_key == tuned.binary_key);
}

TEST_CASE("GPU: a result from another kiln version is tuned again, unless it is pinned") {
  if (!have_gpu()) return;
  ScratchDir dir;
  Runtime& runtime = Runtime::get();
  runtime.set_settings(test_settings(dir.path(), TuneMode::fast));
  ScopedContext context(0);
  Stream stream;
  const Problem problem = rms_problem(DType::bf16, false, 2560);
  const std::int64_t rows = 500;  // bucket 512
  runtime.kernel(0, problem, rows, stream.get());
  const DeviceInfo& info = runtime.device(0);
  TuningDb db(dir.path(), CacheMode::rw);
  auto document = db.load(info.fingerprint(), problem.key(), 512);
  REQUIRE(document);

  // As if an older kiln had measured it.
  (*document)["versions"]["kiln"] = "0.0.0-older";
  REQUIRE(db.store(info.fingerprint(), problem.key(), 512, *document));
  runtime.forget_kernels();
  RuntimeStats before = runtime.stats();
  runtime.kernel(0, problem, rows, stream.get());
  CHECK(runtime.stats().tunes == before.tunes + 1);
  const auto retuned = db.load(info.fingerprint(), problem.key(), 512);
  REQUIRE(retuned);
  CHECK(retuned->at("versions").at("kiln") != "0.0.0-older");

  // Pinned, the old result is used as it is.
  (*document)["pinned"] = true;
  REQUIRE(db.store(info.fingerprint(), problem.key(), 512, *document));
  runtime.forget_kernels();
  before = runtime.stats();
  const Kernel& pinned = runtime.kernel(0, problem, rows, stream.get());
  CHECK(runtime.stats().tunes == before.tunes);
  CHECK(runtime.stats().tuning_hits == before.tuning_hits + 1);
  CHECK(pinned.config == document->at("winner").get<Config>());
}

TEST_CASE("GPU: in a graph capture a kernel comes from the store, untuned, never compiled") {
  if (!have_gpu()) return;
  using BeginCapture = CUresult (*)(CUstream, CUstreamCaptureMode);
  using EndCapture = CUresult (*)(CUstream, void**);
  using GraphDestroy = CUresult (*)(void*);
  void* libcuda = dlopen(driver().path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(libcuda);
  auto begin = reinterpret_cast<BeginCapture>(dlsym(libcuda, "cuStreamBeginCapture_v2"));
  auto end = reinterpret_cast<EndCapture>(dlsym(libcuda, "cuStreamEndCapture"));
  auto destroy = reinterpret_cast<GraphDestroy>(dlsym(libcuda, "cuGraphDestroy"));
  REQUIRE((begin && end && destroy));

  ScratchDir dir;
  Runtime& runtime = Runtime::get();
  runtime.set_settings(test_settings(dir.path(), TuneMode::fast));
  ScopedContext context(0);
  Stream stream;
  const Problem problem = rms_problem(DType::f16, true, 2048);
  const std::int64_t rows = 64;
  const RuntimeStats before = runtime.stats();

  // Buffers are made before capture (allocation is not capturable).
  const Family& fam = family(Op::rms_norm);
  std::vector<DeviceBuffer> buffers;
  std::vector<std::uint64_t> addresses;
  for (const BufferSpec& spec : fam.buffers(problem, rows)) {
    buffers.emplace_back(static_cast<std::size_t>(spec.elements) * dtype_size(spec.dtype));
    addresses.push_back(buffers.back().address());
  }
  const std::vector<std::byte> params = fam.pack_params(problem, rows, addresses);

  // Captures the first call of the problem; returns the kernel, or the error's text.
  const auto capture = [&](const Kernel*& kernel) {
    REQUIRE(begin(stream.get(), CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    std::string failure;
    try {
      kernel = &runtime.kernel(0, problem, rows, stream.get());
      runtime.launch(*kernel, rows, params.data(), stream.get());
    } catch (const Error& error) {
      failure = error.what();
    }
    void* graph = nullptr;
    const CUresult ended = end(stream.get(), &graph);
    if (graph) destroy(graph);
    if (failure.empty()) {
      CHECK(ended == CUDA_SUCCESS);
      CHECK(graph != nullptr);
    }
    return failure;
  };

  // Nothing loaded and nothing stored: a clear error naming the fix, and no compile.
  const Kernel* kernel = nullptr;
  const std::string failure = capture(kernel);
  CHECK(contains(failure, "kiln.warmup"));
  CHECK(runtime.stats().compiles == before.compiles);

  // With the heuristic's binary in the store (as `kiln prewarm` leaves it), the capture
  // loads it: no compile, no tune.
  const Config heuristic = fam.heuristic(problem, runtime.device(0).traits());
  BinaryStore store(dir.path(), CacheMode::rw);
  REQUIRE(jit::compile({&fam, problem, heuristic, runtime.device(0).sm(), BinaryFormat::cubin},
                       &store));
  runtime.forget_kernels();
  const RuntimeStats stored = runtime.stats();
  REQUIRE_MESSAGE(capture(kernel).empty(), "capture with the binary stored failed");
  CHECK(kernel->heuristic_only);
  CHECK(kernel->config == heuristic);
  CHECK(runtime.stats().tunes == before.tunes);
  CHECK(runtime.stats().compiles == stored.compiles);
  TuningDb db(dir.path(), CacheMode::rw);
  CHECK_FALSE(db.load(runtime.device(0).fingerprint(), problem.key(), 64));

  // 64 rows are at most one row per SM on GPUs of 64 SMs or more: with the bucket's own
  // heuristic stored too, that one.
  const Config for_rows = fam.heuristic_for_rows(problem, runtime.device(0).traits(), rows);
  if (for_rows == heuristic) {
    REQUIRE(runtime.device(0).sm_count < rows);
    return;
  }
  REQUIRE(
      jit::compile({&fam, problem, for_rows, runtime.device(0).sm(), BinaryFormat::cubin}, &store));
  runtime.forget_kernels();
  const RuntimeStats both = runtime.stats();
  REQUIRE_MESSAGE(capture(kernel).empty(), "capture with both binaries stored failed");
  CHECK(kernel->config == for_rows);
  CHECK(runtime.stats().compiles == both.compiles);
}

}  // namespace kiln::jit

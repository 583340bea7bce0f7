#include "jit/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/error.h"
#include "cache/log.h"
#include "cache/manifest.h"
#include "cache/tuning_db.h"
#include "jit/compiler.h"
#include "jit/copy_bandwidth.h"
#include "jit/device_probe.h"
#include "jit/evaluator.h"
#include "jit/launch.h"
#include "jit/module.h"
#include "jit/nvrtc.h"
#include "jit/prewarm.h"
#include "jit/tuning_pin.h"
#include "jit/tuning_record.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::jit {
namespace {

struct TableKey {
  int device = 0;
  Problem problem;
  std::int64_t bucket = 0;
  bool operator==(const TableKey&) const = default;
};

struct TableKeyHash {
  std::size_t operator()(const TableKey& key) const noexcept {
    std::size_t h = std::hash<Problem>{}(key.problem);
    h ^= static_cast<std::size_t>(key.bucket) * 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= static_cast<std::size_t>(key.device) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    return h;
  }
};

std::string where(const TableKey& key) {
  return key.problem.key() + " rows<=" + std::to_string(key.bucket) + " on device " +
         std::to_string(key.device);
}

// The heuristics a call of row bucket `bucket` may be served without tuning or, where their
// binaries are stored, without compiling, in order: the family's for the bucket, then its
// row-blind one (what a prewarm compiles for every bucket, and older prewarms and `kiln
// compile` without rows left). One entry where they agree.
std::vector<Config> fallback_heuristics(const Family& family, const Problem& problem,
                                        const DeviceTraits& traits, std::int64_t bucket) {
  std::vector<Config> heuristics{family.heuristic_for_rows(problem, traits, bucket)};
  if (Config row_blind = family.heuristic(problem, traits); !(row_blind == heuristics.front())) {
    heuristics.push_back(std::move(row_blind));
  }
  return heuristics;
}

}  // namespace

Settings Settings::from_env() {
  Settings settings;
  settings.cache_dir = default_cache_dir();
  settings.cache_mode = default_cache_mode();
  settings.record_path = default_record_path();
  const char* tune = std::getenv("KILN_TUNE");
  if (tune && *tune) {
    const auto mode = parse_tune_mode(tune);
    if (!mode) {
      throw Error(std::string("kiln settings: KILN_TUNE: expected one of fast, full, off, got '") +
                  tune + "'");
    }
    settings.tune_mode = *mode;
  }
  const char* capture = std::getenv("KILN_CAPTURE");
  if (capture && *capture) {
    const auto mode = parse_capture_mode(capture);
    if (!mode) {
      throw Error(
          std::string("kiln settings: KILN_CAPTURE: expected one of heuristic, error, got '") +
          capture + "'");
    }
    settings.capture_mode = *mode;
  }
  const char* pdl = std::getenv("KILN_PDL");
  if (pdl && *pdl) {
    const auto on = parse_programmatic_launch(pdl);
    if (!on) {
      throw Error(std::string("kiln settings: KILN_PDL: expected one of on, off, got '") + pdl +
                  "'");
    }
    settings.programmatic_launch = *on;
  }
  return settings;
}

std::optional<bool> parse_programmatic_launch(std::string_view text) {
  if (text == "on") {
    return true;
  }
  if (text == "off") {
    return false;
  }
  return std::nullopt;
}

struct Runtime::Impl {
  // The hot table. Kernels are held by pointer so references handed out stay valid while
  // the map rehashes; dropped ones are retired, never freed, since a caller may still hold one.
  mutable std::shared_mutex table_mutex;
  std::unordered_map<TableKey, std::unique_ptr<Kernel>, TableKeyHash> table;
  std::vector<std::unique_ptr<Kernel>> retired;

  // One resolve at a time: it may compile and tune, which uses the whole GPU anyway.
  std::mutex resolve_mutex;

  mutable std::mutex settings_mutex;
  std::optional<Settings> settings;  // read from the environment when first needed
  std::shared_ptr<BinaryStore> store;

  std::mutex devices_mutex;
  std::optional<int> count;
  std::map<int, std::unique_ptr<DeviceInfo>> devices;

  // Measured once per device and process, when its first tuning result is stored (under
  // resolve_mutex): the ceiling `kiln report` compares candidates with.
  std::map<int, std::optional<double>> copy_bandwidth_gbs;

  std::optional<double> copy_bandwidth(const DeviceInfo& info) {
    auto it = copy_bandwidth_gbs.find(info.ordinal);
    if (it == copy_bandwidth_gbs.end())
      it = copy_bandwidth_gbs.emplace(info.ordinal, measure_copy_bandwidth_gbs(info)).first;
    return it->second;
  }

  // (problem, arch) already appended to the KILN_RECORD manifest by this process.
  std::mutex recorded_mutex;
  std::set<std::pair<std::string, int>> recorded;

  std::atomic<std::uint64_t> hot_hits{0}, resolves{0}, compiles{0}, binary_hits{0}, tunes{0},
      tuning_hits{0};

  Settings current_settings() {
    std::lock_guard lock(settings_mutex);
    if (!settings) settings = Settings::from_env();
    return *settings;
  }

  std::shared_ptr<BinaryStore> current_store() {
    const Settings s = current_settings();
    std::lock_guard lock(settings_mutex);
    if (!store) store = std::make_shared<BinaryStore>(s.cache_dir, s.cache_mode);
    return store;
  }

  void forget() {
    std::unique_lock lock(table_mutex);
    for (auto& [key, kernel] : table) retired.push_back(std::move(kernel));
    table.clear();
  }

  const Kernel* find(const TableKey& key) const {
    std::shared_lock lock(table_mutex);
    const auto it = table.find(key);
    return it == table.end() ? nullptr : it->second.get();
  }

  void record(const Settings& settings, const Problem& problem, int sm) {
    if (settings.record_path.empty()) return;
    {
      std::lock_guard lock(recorded_mutex);
      if (!recorded.emplace(problem.key(), sm).second) return;
    }
    append_manifest_record(settings.record_path, manifest_record(problem, sm));
  }

  // The config to use: a stored tuning result for the device, else a prewarm record for its
  // arch (when `use_prewarm`), else a tune on `rows` rows (the call's that missed), else the
  // heuristic.
  Config choose_config(const TableKey& key, std::int64_t rows, const Family& family,
                       const DeviceInfo& info, const Settings& settings, BinaryStore* store,
                       bool capturing, bool& heuristic_only, bool& from_prewarm,
                       bool use_prewarm = true) {
    const DeviceTraits traits = info.traits();
    const std::string fingerprint = info.fingerprint();
    const std::string problem_key = key.problem.key();
    TuningDb db(settings.cache_dir, settings.cache_mode);
    // A winner measured with other kiln or NVRTC versions is tuned again where tuning is
    // possible and kept otherwise: it is still a better guess than the heuristic.
    std::optional<Config> stale;
    if (auto document = db.load(fingerprint, problem_key, key.bucket)) {
      std::string why;
      if (auto winner = usable_winner(*document, family, key.problem, traits, why)) {
        const std::string stale_why =
            stale_reason(*document, KILN_VERSION, nvrtc().version_string());
        if (stale_why.empty() || settings.cache_mode != CacheMode::rw) {
          ++tuning_hits;
          return *winner;
        }
        log::info("kiln: tuning result for " + where(key) + " " + stale_why +
                  ": tuning again (`kiln tune pin` keeps a result)");
        stale = winner;
      } else {
        log::info("kiln: tuning result for " + where(key) + " not used: " + why);
      }
    }
    const auto fallback = [&](const Config& heuristic) {
      if (!stale) return heuristic;
      ++tuning_hits;
      heuristic_only = false;
      return *stale;
    };

    heuristic_only = true;
    // A pre-warmed fleet: the config whose binary `kiln prewarm` stored for this arch and
    // row bucket serves at once, so the request path neither tunes nor compiles (see
    // jit/prewarm.h).
    if (use_prewarm && !stale) {
      if (auto record = db.load(prewarm_device(info.sm()), problem_key, kPrewarmBucket)) {
        std::string why;
        if (auto config =
                usable_prewarm_config(*record, family, key.problem, traits, key.bucket, why)) {
          from_prewarm = true;
          return *config;
        }
        log::info("kiln: prewarm record for " + where(key) + " not used: " + why);
      }
    }
    const std::vector<Config> heuristics =
        fallback_heuristics(family, key.problem, traits, key.bucket);
    const Config& heuristic = heuristics.front();
    if (settings.cache_mode == CacheMode::strict) {
      // A strict fleet never compiles (nor tunes): the first heuristic whose binary is stored,
      // else the bucket's (whose compile then names what is missing).
      const auto stored = std::find_if(heuristics.begin(), heuristics.end(), [&](const Config& c) {
        return find_stored({&family, key.problem, c, info.sm(), BinaryFormat::cubin}, store)
            .has_value();
      });
      const Config& chosen = stored == heuristics.end() ? heuristic : *stored;
      log::info("kiln: KILN_CACHE=strict and no tuning result for " + where(key) +
                ": using the heuristic config " + chosen.key());
      return chosen;
    }
    if (settings.tune_mode == TuneMode::off) {
      return fallback(heuristic);
    }
    // Never tune inside a capture (jit/capture_policy.h).
    if (capturing) {
      return fallback(heuristic);
    }
    try {
      GpuEvaluator evaluator(info, store);
      // Timed on the call's own rows, as Triton's autotuner times the call that misses its key:
      // how many waves the rows make of each config's CTAs decides which is fastest, and a
      // model calls a bucket at a few row counts (a DiT's tokens, a serving engine's captured
      // batches). Calls past the largest bucket are timed on the bucket's rows, its steady state.
      const TuneResult result = tune(family, key.problem, std::min(rows, key.bucket), traits,
                                     settings.tune_mode, evaluator);
      compiles += evaluator.compiles();
      binary_hits += evaluator.binary_hits();
      ++tunes;
      db.store(fingerprint, problem_key, key.bucket,
               tuning_document(result, info, nvrtc().version_string(), copy_bandwidth(info)));
      heuristic_only = false;
      return result.winner;
    } catch (const Error& error) {
      log::warn("kiln: tuning " + where(key) + " failed; using the heuristic config " +
                heuristic.key() + " (not stored): " + error.message());
      return fallback(heuristic);
    }
  }

  // A function this process already loaded for (device, problem, config) at another row
  // bucket, usable for `key`'s bucket (its dynamic shared memory opt-in covers this one's).
  const Kernel* loaded_elsewhere(const TableKey& key, const Config& config) const {
    constexpr std::uint32_t kDefaultDynamicSmem = 48 * 1024;
    const Family& fam = family(key.problem.op);
    const std::uint32_t needed = fam.geometry(key.problem, config, key.bucket).smem_bytes;
    std::shared_lock lock(table_mutex);
    for (const auto& [other, kernel] : table) {
      if (other.device != key.device || !(other.problem == key.problem) ||
          !(kernel->config == config)) {
        continue;
      }
      if (needed <= kDefaultDynamicSmem ||
          fam.geometry(key.problem, config, other.bucket).smem_bytes >= needed) {
        return kernel.get();
      }
    }
    return nullptr;
  }

  // Readies `kernel` inside a CUDA graph capture without compiling: its config's function
  // from memory (another bucket) or its binary from the store, else the same for the family's
  // heuristic for the bucket, then for its row-blind heuristic (what a prewarm compiles for
  // every bucket), switching `kernel` to the one found. Returns the binary to load, or nullopt
  // when `kernel.function` was set from memory. None present is an error naming the fix.
  std::optional<CompiledKernel> ready_in_capture(const TableKey& key, Kernel& kernel,
                                                 const DeviceInfo& info, BinaryStore* store) {
    const Config chosen = kernel.config;
    const std::vector<Config> heuristics =
        fallback_heuristics(*kernel.family, key.problem, info.traits(), key.bucket);
    std::vector<Config> candidates{chosen};
    for (const Config& config : heuristics) {
      if (!(config == chosen)) {
        candidates.push_back(config);
      }
    }
    for (const Config& config : candidates) {
      if (!(config == chosen)) {
        log::info("kiln: " + where(key) + " first seen during a CUDA graph capture: config " +
                  chosen.key() + " is neither loaded nor in the binary store; trying the " +
                  "heuristic " + config.key());
        kernel.config = config;
        kernel.heuristic_only = true;
        kernel.from_prewarm = false;
      }
      if (const Kernel* loaded = loaded_elsewhere(key, config)) {
        kernel.function = loaded->function;
        kernel.binary_key = loaded->binary_key;
        return std::nullopt;
      }
      const CompileRequest request{kernel.family, key.problem, config, info.sm(),
                                   BinaryFormat::cubin};
      if (auto stored = find_stored(request, store)) return stored;
    }
    std::string tried = chosen.key();
    for (std::size_t i = 1; i < candidates.size(); ++i) {
      tried += (candidates[i] == heuristics.front()
                    ? ", heuristic for rows<=" + std::to_string(key.bucket)
                    : std::string(", row-blind heuristic")) +
               " " + candidates[i].key();
    }
    throw Error(
        capture_miss_message(key.problem, key.bucket, key.device,
                             "is neither loaded nor in the binary store (config " + tried + ")"));
  }
};

namespace {

// The row bucket of a call. Up to 2^16 rows it needs nothing but the row count, so an op
// call's lookup stays a table lookup; only larger calls ask the family for its bytes per row.
std::int64_t bucket_of(const Problem& problem, std::int64_t rows) {
  return rows <= kSmallestLargestBucket ? row_bucket(rows)
                                        : row_bucket(family(problem.op), problem, rows);
}

}  // namespace

Runtime::Runtime() : impl_(std::make_unique<Impl>()) {}
Runtime::~Runtime() = default;

Runtime& Runtime::get() {
  // Never destroyed: kernels may be launched from other static destructors at exit, and
  // nothing here needs tearing down (modules and contexts live as long as the process).
  static Runtime* runtime = new Runtime();
  return *runtime;
}

const Kernel& Runtime::kernel(int device, const Problem& problem, std::int64_t rows,
                              CUstream stream) {
  const TableKey key{device, problem, bucket_of(problem, rows)};
  if (const Kernel* hit = impl_->find(key)) {
    impl_->hot_hits.fetch_add(1, std::memory_order_relaxed);
    return *hit;
  }

  std::lock_guard resolving(impl_->resolve_mutex);
  if (const Kernel* hit = impl_->find(key)) {
    impl_->hot_hits.fetch_add(1, std::memory_order_relaxed);
    return *hit;
  }
  ++impl_->resolves;
  const Family& fam = family(problem.op);
  fam.check(problem);
  const DeviceInfo& info = this->device(device);
  const Settings settings = impl_->current_settings();
  const std::shared_ptr<BinaryStore> store = impl_->current_store();

  const bool capturing = stream_is_capturing(device, stream);
  if (capturing && settings.capture_mode == CaptureMode::error) {
    throw Error(capture_miss_message(problem, key.bucket, device,
                                     "is not loaded in this process (KILN_CAPTURE=error)"));
  }

  auto kernel = std::make_unique<Kernel>();
  kernel->family = &fam;
  kernel->problem = problem;
  kernel->device = device;
  kernel->bucket = key.bucket;
  kernel->in_capture = capturing;
  if (settings.programmatic_launch && supports_programmatic_launch(info)) {
    kernel->order = StreamOrder::programmatic;
  }
  impl_->record(settings, problem, info.sm());
  kernel->config = impl_->choose_config(key, rows, fam, info, settings, store.get(), capturing,
                                        kernel->heuristic_only, kernel->from_prewarm);

  std::optional<CompiledKernel> compiled;
  if (capturing) {
    compiled = impl_->ready_in_capture(key, *kernel, info, store.get());
    log::info("kiln: " + where(key) + " first seen during a CUDA graph capture: config " +
              kernel->config.key() + (compiled ? " loaded from the binary store" : " reused") +
              " (no compile, no tuning)");
  } else {
    Expected<CompiledKernel> fresh = jit::compile(
        CompileRequest{&fam, problem, kernel->config, info.sm(), BinaryFormat::cubin}, store.get());
    if (!fresh) throw fresh.error();
    compiled = std::move(fresh.value());
  }
  if (compiled) {
    ++(compiled->from_cache ? impl_->binary_hits : impl_->compiles);
    const LaunchGeometry geometry = fam.geometry(problem, kernel->config, key.bucket);
    kernel->function = load_kernel(device, *compiled, geometry.smem_bytes).function;
    kernel->binary_key = compiled->key;
  }

  std::unique_lock lock(impl_->table_mutex);
  const auto [it, inserted] = impl_->table.emplace(key, std::move(kernel));
  return *it->second;
}

bool Runtime::tune_and_store(int device, const Problem& problem, std::int64_t rows) {
  const TableKey key{device, problem, bucket_of(problem, rows)};
  std::lock_guard resolving(impl_->resolve_mutex);
  const Family& fam = family(problem.op);
  fam.check(problem);
  const DeviceInfo& info = this->device(device);
  Settings settings = impl_->current_settings();
  if (settings.tune_mode == TuneMode::off) settings.tune_mode = TuneMode::fast;
  const std::shared_ptr<BinaryStore> store = impl_->current_store();
  const std::uint64_t tunes_before = impl_->tunes.load();
  bool heuristic_only = false, from_prewarm = false;
  impl_->choose_config(key, rows, fam, info, settings, store.get(),
                       stream_is_capturing(device, nullptr), heuristic_only, from_prewarm,
                       /*use_prewarm=*/false);
  return impl_->tunes.load() > tunes_before;
}

void Runtime::launch(const Kernel& kernel, std::int64_t rows, const void* params, CUstream stream) {
  const LaunchGeometry geometry = kernel.family->geometry(kernel.problem, kernel.config, rows);
  launch_kernel(kernel.device, kernel.function, geometry, params, stream, kernel.order);
}

int Runtime::device_count() {
  std::lock_guard lock(impl_->devices_mutex);
  if (!impl_->count) impl_->count = jit::device_count();
  return *impl_->count;
}

const DeviceInfo& Runtime::device(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw Error("kiln: device " + std::to_string(ordinal) + ": expected an ordinal in [0, " +
                std::to_string(count) + ")");
  }
  std::lock_guard lock(impl_->devices_mutex);
  auto& slot = impl_->devices[ordinal];
  if (!slot) slot = std::make_unique<DeviceInfo>(probe_device(ordinal));
  return *slot;
}

Settings Runtime::settings() const {
  return impl_->current_settings();
}

void Runtime::set_settings(const Settings& settings) {
  {
    std::lock_guard lock(impl_->settings_mutex);
    impl_->settings = settings;
    impl_->store.reset();
  }
  impl_->forget();
}

RuntimeStats Runtime::stats() const {
  RuntimeStats s;
  s.hot_hits = impl_->hot_hits.load();
  s.resolves = impl_->resolves.load();
  s.compiles = impl_->compiles.load();
  s.binary_hits = impl_->binary_hits.load();
  s.tunes = impl_->tunes.load();
  s.tuning_hits = impl_->tuning_hits.load();
  return s;
}

void Runtime::forget_kernels() {
  impl_->forget();
}

std::vector<Kernel> Runtime::loaded_kernels() const {
  std::shared_lock lock(impl_->table_mutex);
  std::vector<Kernel> kernels;
  kernels.reserve(impl_->table.size());
  for (const auto& [key, kernel] : impl_->table) kernels.push_back(*kernel);
  return kernels;
}

}  // namespace kiln::jit

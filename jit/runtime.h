// The front door. The op bindings ask for a kernel for (device, problem, rows) and launch
// it; everything behind (tuning db, tuner, binary store, NVRTC, module loading) happens on
// a miss, once per (device, problem, row bucket) per process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/settings.h"
#include "jit/capture_policy.h"
#include "jit/cuda_api.h"
#include "jit/device.h"
#include "jit/launch.h"
#include "templates/family.h"
#include "tuner/tuner.h"

namespace kiln::jit {

struct Settings {
  std::filesystem::path cache_dir;
  CacheMode cache_mode = CacheMode::rw;
  TuneMode tune_mode = TuneMode::fast;
  // Where every specialisation this process asks for is appended (a manifest for
  // `kiln prewarm --manifest`); empty: not recording.
  std::filesystem::path record_path;
  // What a kernel first needed during a CUDA graph capture may use (jit/capture_policy.h).
  CaptureMode capture_mode = CaptureMode::heuristic;
  // Whether op calls launch programmatically where the device supports it (KILN_PDL=on|off;
  // jit/launch.h): a kernel's CTAs are placed while the kernel ahead of it drains.
  bool programmatic_launch = true;
  // From KILN_CACHE_DIR, KILN_CACHE, KILN_TUNE, KILN_RECORD, KILN_CAPTURE, KILN_PDL.
  static Settings from_env();
};

// KILN_PDL's values: "on" -> true, "off" -> false, anything else -> nullopt.
std::optional<bool> parse_programmatic_launch(std::string_view text);

struct Kernel {
  CUfunction function = nullptr;
  const Family* family = nullptr;
  Problem problem;
  Config config;
  int device = 0;
  std::string binary_key;
  bool heuristic_only = false;  // resolved without a tuning result (tune off, or capturing)
  bool from_prewarm = false;    // config taken from a prewarm record (jit/prewarm.h)
  bool in_capture = false;      // first resolved while its stream was being captured
  StreamOrder order = StreamOrder::serial;  // how its launches follow the kernel ahead
  std::int64_t bucket = 0;                  // the row bucket it serves
};

struct RuntimeStats {
  std::uint64_t hot_hits = 0;
  std::uint64_t resolves = 0;     // misses of the in-memory table
  std::uint64_t compiles = 0;     // NVRTC compiles done by this process
  std::uint64_t binary_hits = 0;  // binaries loaded from disk
  std::uint64_t tunes = 0;        // tunes run
  std::uint64_t tuning_hits = 0;  // tuning results read from disk
};

class Runtime {
 public:
  static Runtime& get();

  // Hot path: a table lookup. A miss resolves (and may compile and tune); while `stream` is
  // capturing a CUDA graph, nothing is compiled or tuned: the kernel comes from the binary
  // store or the call throws (KILN_CAPTURE, jit/capture_policy.h).
  const Kernel& kernel(int device, const Problem& problem, std::int64_t rows, CUstream stream);
  // For `kiln prewarm --tune`: tunes (device, problem, row bucket of `rows`) on `rows` rows
  // (up to the bucket's) and stores the result, unless the tuning database already has one
  // for the device. Returns true when it tuned. Prewarm records are not consulted.
  bool tune_and_store(int device, const Problem& problem, std::int64_t rows);
  // Launches with the family's geometry for `rows` rows; `params` points at the kernel's
  // parameter struct.
  void launch(const Kernel& kernel, std::int64_t rows, const void* params, CUstream stream);

  int device_count();
  const DeviceInfo& device(int ordinal);

  Settings settings() const;
  void set_settings(const Settings& settings);  // also drops the in-memory table
  RuntimeStats stats() const;
  // Drops the in-memory table (next call resolves from disk), keeping loaded modules alive.
  void forget_kernels();
  // A copy of every kernel in the in-memory table (what this process has ready to launch).
  std::vector<Kernel> loaded_kernels() const;

  ~Runtime();

 private:
  Runtime();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::jit

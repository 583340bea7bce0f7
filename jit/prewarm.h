// Offline pre-warming: compile the kernels a fleet will ask for into the disk cache ahead of
// time, for any list of archs, with no GPU (`kiln prewarm`, `kiln.prewarm`).
//
// For each (problem, arch) it compiles the family's heuristic config for the arch's typical
// traits (DeviceTraits::for_arch) to a cubin through the same content-keyed binary store and
// the same compile path the runtime uses, so the binary key is the one a GPU process of that
// arch computes (same NVRTC, same sources). It also writes a *prewarm record*: a tuning-db
// document under the pseudo-device "prewarm-sm_XX" (row bucket 0) whose winner is that config.
// Where the family's heuristic for a row bucket differs (the norms' latency config for calls
// of at most one row per SM), that config is compiled too, and the record's "by_rows" names
// it: ranges of row buckets ascending, each {"up_to_rows", "winner", "binary_key"}; buckets
// past the last range take "winner".
//
// What a GPU process then does on its first call of a problem (jit/runtime.cpp): a tuning
// result for its own device wins; else a prewarm record for its arch that is valid on the
// device is used as is, with no tuning and no compile (the binary is in the store). A fleet
// that pre-warms thus never compiles or tunes on a request path; to use tuned configs instead,
// run `kiln prewarm --tune` on a machine with that GPU (it stores device tuning results, which
// take precedence over the records).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cache/binary_store.h"
#include "cache/manifest.h"
#include "templates/family.h"
#include "templates/types.h"

namespace kiln::jit {

struct PrewarmTarget {
  Problem problem;
  int sm = 90;
  bool operator==(const PrewarmTarget&) const = default;
};

// The tuning-db device folder holding prewarm records for an arch: "prewarm-sm_90".
std::string prewarm_device(int sm);
inline constexpr std::int64_t kPrewarmBucket = 0;

// A record's "by_rows": the family's heuristic for the row buckets from 1, as ranges of
// buckets with one config each (the largest bucket of the range, the config), ascending, up to
// the last range whose config differs from the row-blind heuristic; empty where none does.
std::vector<std::pair<std::int64_t, Config>> prewarm_row_configs(const Family& family,
                                                                 const Problem& problem,
                                                                 const DeviceTraits& device);

// The config a prewarm record gives calls of row bucket `bucket` on `device`: the family's
// heuristic for the bucket on the device where the record names its binary, else the record's
// "by_rows" range for the bucket, else its "winner"; each only when still valid for the
// problem on the device. nullopt when none is (or the record is unreadable), with `why`
// saying what was wrong.
std::optional<Config> usable_prewarm_config(const nlohmann::json& record, const Family& family,
                                            const Problem& problem, const DeviceTraits& device,
                                            std::int64_t bucket, std::string& why);

// A KILN_RECORD manifest line: the problem's fields (aux always present) and "arch".
nlohmann::json manifest_record(const Problem& problem, int sm);

// ops x dtypes x sizes x archs, each through the family's common_problems for `model`.
// `sizes` gives the hidden sizes per op. When the model trains, each op's backward op comes
// too, at the same sizes (a family whose backward is a form of its own op, RoPE's inverse
// rotation, adds it itself). Ops whose family is not registered are left out, each with a
// line in `notes`. Duplicates are dropped; order is stable.
std::vector<PrewarmTarget> expand_targets(const std::vector<Op>& ops,
                                          const std::vector<DType>& dtypes,
                                          const std::map<Op, std::vector<std::int64_t>>& sizes,
                                          const std::vector<int>& archs,
                                          std::vector<std::string>& notes,
                                          const PrewarmModel& model = {});

// What `kiln prewarm --op ... --hidden ...` compiles: every op at every hidden size, for no
// particular model (expand_targets with a default PrewarmModel).
std::vector<PrewarmTarget> listed_targets(const std::vector<Op>& ops,
                                          const std::vector<std::int64_t>& hiddens,
                                          const std::vector<DType>& dtypes,
                                          const std::vector<int>& archs, bool training,
                                          std::vector<std::string>& notes);

// The (problem, arch) of every record of a manifest; `archs`, when not empty, replaces each
// record's arch (one target per arch). Records that do not parse, or whose family is not
// registered, are noted and left out.
std::vector<PrewarmTarget> targets_from_manifest(const ManifestRead& manifest,
                                                 const std::vector<int>& archs,
                                                 std::vector<std::string>& notes);

struct PrewarmSummary {
  // Binaries (a target has one per distinct config its records name).
  std::size_t compiled = 0;
  std::size_t reused = 0;  // the binary was already in the store
  std::size_t failed = 0;  // targets with a config that did not compile
  double seconds = 0;
  std::vector<std::string> failures;  // one line each: the specialisation and why
};

struct PrewarmOptions {
  int jobs = 1;
  // Called after each target (from worker threads, serialised): done so far, total.
  std::function<void(std::size_t, std::size_t)> progress;
};

// Compiles every target into `store` (cubins) and writes its prewarm record beside the
// store's tuning results. Targets run on `jobs` threads.
PrewarmSummary prewarm(const std::vector<PrewarmTarget>& targets, BinaryStore& store,
                       const PrewarmOptions& options);

}  // namespace kiln::jit

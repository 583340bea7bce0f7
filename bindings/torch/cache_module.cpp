// Thin: each converts arguments, releases the GIL for file and compile work, and calls
// cache/ or jit/.
#include "bindings/torch/cache_module.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/cache_admin.h"
#include "cache/cache_stats.h"
#include "cache/error.h"
#include "cache/file_io.h"
#include "cache/manifest.h"
#include "jit/model_config.h"
#include "jit/prewarm.h"
#include "jit/runtime.h"
#include "jit/specialisation.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

std::filesystem::path root_or_current(const py::object& cache_dir) {
  return cache_dir.is_none() ? jit::Runtime::get().settings().cache_dir
                             : std::filesystem::path(cache_dir.cast<std::string>());
}

py::dict counters_dict(const CacheCounters& c) {
  const nlohmann::json j = c;
  py::dict d;
  for (const auto& [name, value] : j.items()) {
    if (value.is_number_float()) {
      d[py::str(name)] = value.get<double>();
    } else {
      d[py::str(name)] = value.get<std::uint64_t>();
    }
  }
  return d;
}

py::dict cache_stats(const py::object& cache_dir) {
  const auto root = root_or_current(cache_dir);
  py::dict d = counters_dict(persisted_cache_counters(root));
  std::uint64_t bytes = 0;
  const auto entries = list_binary_entries(root);
  for (const auto& entry : entries) {
    bytes += entry.bytes;
  }
  d["cache_dir"] = root.string();
  d["binaries"] = entries.size();
  d["bytes"] = bytes;
  return d;
}

py::list cache_ls(const py::object& cache_dir) {
  py::list out;
  for (const auto& entry : list_binary_entries(root_or_current(cache_dir))) {
    py::dict d;
    d["key"] = entry.key;
    d["path"] = entry.path.string();
    d["bytes"] = entry.bytes;
    d["last_used"] = entry.last_used;
    out.append(d);
  }
  return out;
}

py::dict cache_verify(const py::object& cache_dir) {
  const auto root = root_or_current(cache_dir);
  VerifyResult result;
  {
    py::gil_scoped_release unlocked;
    result = verify_cache(root);
  }
  py::dict d;
  d["binaries"] = result.binaries;
  d["bad_binaries"] = result.bad_binaries;
  d["tuning_results"] = result.tuning_results;
  d["bad_tuning_results"] = result.bad_tuning_results;
  d["problems"] = result.problems;
  return d;
}

py::dict cache_trim(const std::string& max_size, const py::object& cache_dir) {
  const auto bytes = parse_size(max_size);
  if (!bytes) {
    throw ArgumentError("cache_trim", "max_size", "a size such as 2G", max_size);
  }
  const auto root = root_or_current(cache_dir);
  TrimResult result;
  {
    py::gil_scoped_release unlocked;
    result = trim_cache(root, *bytes, *bytes);
  }
  py::dict d;
  d["removed"] = result.removed;
  d["removed_bytes"] = result.removed_bytes;
  d["kept"] = result.kept;
  d["kept_bytes"] = result.kept_bytes;
  d["debris_removed"] = result.debris_removed;
  return d;
}

py::dict transfer(const std::string& bundle, const py::object& cache_dir, bool exporting) {
  const auto root = root_or_current(cache_dir);
  TransferResult result;
  {
    py::gil_scoped_release unlocked;
    result = exporting ? export_cache(root, bundle) : import_cache(root, bundle);
  }
  py::dict d;
  d["copied"] = result.copied;
  d["present"] = result.present;
  d["bad"] = result.bad;
  return d;
}

py::dict prewarm(const std::vector<std::string>& op_names,
                 const std::vector<std::string>& dtype_names,
                 const std::vector<std::int64_t>& hiddens,
                 const std::vector<std::string>& arch_names, const py::object& config_path,
                 const py::object& manifest_path, int jobs, bool training) {
  std::vector<Op> ops;
  for (const auto& name : op_names) {
    const auto op = parse_op(name);
    if (!op) {
      throw ArgumentError("prewarm", "ops", "kiln ops", "'" + name + "'");
    }
    ops.push_back(*op);
  }
  std::vector<DType> dtypes;
  for (const auto& name : dtype_names) {
    const auto dtype = parse_dtype(name);
    if (!dtype) {
      throw ArgumentError("prewarm", "dtypes", "fp32, fp16 or bf16", "'" + name + "'");
    }
    dtypes.push_back(*dtype);
  }
  std::vector<int> archs;
  archs.reserve(arch_names.size());
  for (const auto& name : arch_names) {
    archs.push_back(jit::parse_arch(name));
  }

  std::vector<std::string> notes;
  std::vector<jit::PrewarmTarget> targets;
  if (!manifest_path.is_none()) {
    targets =
        jit::targets_from_manifest(read_manifest(manifest_path.cast<std::string>()), archs, notes);
  }
  if (!config_path.is_none() || !hiddens.empty()) {
    if (archs.empty()) {
      throw ArgumentError("prewarm", "archs", "at least one arch", "none");
    }
  }
  if (!config_path.is_none()) {
    const auto document = jit::read_config_file(config_path.cast<std::string>(), "kiln.prewarm");
    auto more =
        jit::model_targets(jit::read_model_config(document), ops, dtypes, archs, training, notes);
    targets.insert(targets.end(), more.begin(), more.end());
  }
  if (!hiddens.empty()) {
    auto more = jit::listed_targets(ops, hiddens, dtypes, archs, training, notes);
    targets.insert(targets.end(), more.begin(), more.end());
  }

  const jit::Settings settings = jit::Runtime::get().settings();
  if (settings.cache_mode != CacheMode::rw) {
    throw Error("kiln.prewarm: the cache is in mode " +
                std::string(cache_mode_name(settings.cache_mode)) + "; prewarming writes to it");
  }
  BinaryStore store(settings.cache_dir, settings.cache_mode);
  jit::PrewarmSummary summary;
  {
    py::gil_scoped_release unlocked;
    jit::PrewarmOptions options;
    options.jobs = jobs;
    summary = jit::prewarm(targets, store, options);
  }
  py::dict d;
  d["targets"] = targets.size();
  d["compiled"] = summary.compiled;
  d["reused"] = summary.reused;
  d["failed"] = summary.failed;
  d["seconds"] = summary.seconds;
  d["failures"] = summary.failures;
  d["notes"] = notes;
  return d;
}

}  // namespace

void add_cache_functions(py::module_& m) {
  m.def("cache_stats", &cache_stats, py::arg("cache_dir") = py::none());
  m.def("process_cache_stats", [] { return counters_dict(process_cache_counters()); });
  m.def("cache_ls", &cache_ls, py::arg("cache_dir") = py::none());
  m.def("cache_verify", &cache_verify, py::arg("cache_dir") = py::none());
  m.def("cache_trim", &cache_trim, py::arg("max_size"), py::arg("cache_dir") = py::none());
  m.def(
      "cache_clear",
      [](const py::object& cache_dir) { return clear_cache(root_or_current(cache_dir)); },
      py::arg("cache_dir") = py::none());
  m.def(
      "cache_export",
      [](const std::string& bundle, const py::object& cache_dir) {
        return transfer(bundle, cache_dir, true);
      },
      py::arg("bundle"), py::arg("cache_dir") = py::none());
  m.def(
      "cache_import",
      [](const std::string& bundle, const py::object& cache_dir) {
        return transfer(bundle, cache_dir, false);
      },
      py::arg("bundle"), py::arg("cache_dir") = py::none());
  m.def("prewarm", &prewarm, py::arg("ops"), py::arg("dtypes"), py::arg("hiddens"),
        py::arg("archs"), py::arg("config") = py::none(), py::arg("manifest") = py::none(),
        py::arg("jobs") = 1, py::arg("training") = false);
}

}  // namespace kiln::python

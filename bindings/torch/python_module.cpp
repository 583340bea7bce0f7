// kiln._C: the Python-facing functions that are not tensor ops (device info, offline
// compiles, settings, statistics). Thin: each converts arguments and calls jit/.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bindings/torch/cache_module.h"
#include "bindings/torch/direct_calls.h"
#include "bindings/torch/report_module.h"
#include "cache/cache_stats.h"
#include "cache/error.h"
#include "jit/compiler.h"
#include "jit/runtime.h"
#include "jit/shared_library.h"
#include "jit/specialisation.h"
#include "templates/family.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

py::dict device_dict(const jit::DeviceInfo& info) {
  py::dict d;
  d["ordinal"] = info.ordinal;
  d["name"] = info.name;
  d["compute_capability"] = py::make_tuple(info.cc_major, info.cc_minor);
  d["arch"] = "sm_" + std::to_string(info.sm());
  d["sm_count"] = info.sm_count;
  d["l2_bytes"] = info.l2_bytes;
  d["smem_per_block"] = info.smem_per_block;
  d["smem_per_block_optin"] = info.smem_per_block_optin;
  d["smem_per_sm"] = info.smem_per_sm;
  d["max_threads_per_block"] = info.max_threads_per_block;
  d["max_threads_per_sm"] = info.max_threads_per_sm;
  d["memory_bytes"] = info.memory_bytes;
  d["memory_bus_bits"] = info.memory_bus_bits;
  d["memory_clock_khz"] = info.memory_clock_khz;
  d["datasheet_bandwidth_gbs"] = info.datasheet_bandwidth_gbs();
  d["driver_version"] = info.driver_version;
  d["fingerprint"] = info.fingerprint();
  return d;
}

py::dict compile_one(const std::string& op, const std::string& dtype, std::int64_t hidden,
                     const std::string& arch, bool weight, const std::string& format,
                     std::uint32_t align, const py::object& config,
                     std::optional<std::uint32_t> flags, std::optional<std::int64_t> rows,
                     std::int64_t aux) {
  if (format != "ptx" && format != "cubin") {
    throw ArgumentError("compile", "format", "ptx or cubin", "'" + format + "'");
  }
  jit::SpecialisationSpec spec;
  spec.op = op;
  spec.dtype = dtype;
  spec.hidden = hidden;
  spec.weight = weight;
  spec.flags = flags;
  spec.align = align;
  spec.rows = rows;
  spec.aux = aux;
  jit::set_target_arch(spec, arch);
  spec.format = format == "ptx" ? jit::BinaryFormat::ptx : jit::BinaryFormat::cubin;
  if (!config.is_none()) {
    const auto items = config.cast<py::dict>();
    Config chosen;
    chosen.vec_bytes = items["vec_bytes"].cast<int>();
    chosen.threads_per_row = items["threads_per_row"].cast<int>();
    chosen.cta_threads = items["cta_threads"].cast<int>();
    for (const auto& [key, value] : items) {  // the rest are the family's extra tunables
      const auto name = key.cast<std::string>();
      if (name != "vec_bytes" && name != "threads_per_row" && name != "cta_threads") {
        chosen.extra[name] = value.cast<std::int64_t>();
      }
    }
    spec.config = chosen;
  }
  const jit::CompileRequest request = jit::make_compile_request(spec);
  const jit::Settings settings = jit::Runtime::get().settings();
  BinaryStore store(settings.cache_dir, settings.cache_mode);
  const jit::CompiledKernel kernel = [&] {
    py::gil_scoped_release unlocked;  // NVRTC can take a second; let other threads run
    return jit::compile(request, &store).value();
  }();
  py::dict d;
  d["key"] = kernel.key;
  d["name_expression"] = kernel.name_expression;
  d["lowered_name"] = kernel.lowered_name;
  d["config"] = request.config.key();
  d["arch"] = "sm_" + std::to_string(request.sm);
  d["format"] = format;
  d["binary"] = py::bytes(kernel.binary.data(), kernel.binary.size());
  d["log"] = kernel.log;
  d["compile_ms"] = kernel.compile_ms;
  d["from_cache"] = kernel.from_cache;
  return d;
}

py::dict settings_dict() {
  const jit::Settings s = jit::Runtime::get().settings();
  py::dict d;
  d["cache_dir"] = s.cache_dir.string();
  d["cache_mode"] = std::string(cache_mode_name(s.cache_mode));
  d["tune_mode"] = std::string(tune_mode_name(s.tune_mode));
  d["record"] = s.record_path.string();
  d["capture"] = std::string(jit::capture_mode_name(s.capture_mode));
  d["pdl"] = std::string(s.programmatic_launch ? "on" : "off");
  return d;
}

void set_settings(const py::object& cache_dir, const py::object& cache_mode,
                  const py::object& tune_mode, const py::object& record,
                  const py::object& capture_mode, const py::object& pdl) {
  jit::Settings s = jit::Runtime::get().settings();
  if (!pdl.is_none()) {
    const auto text = pdl.cast<std::string>();
    const auto on = jit::parse_programmatic_launch(text);
    if (!on) {
      throw ArgumentError("configure", "pdl", "on or off", text);
    }
    s.programmatic_launch = *on;
  }
  if (!capture_mode.is_none()) {
    const auto text = capture_mode.cast<std::string>();
    const auto mode = jit::parse_capture_mode(text);
    if (!mode) throw ArgumentError("configure", "capture", "heuristic or error", text);
    s.capture_mode = *mode;
  }
  if (!record.is_none()) s.record_path = record.cast<std::string>();
  if (!cache_dir.is_none()) s.cache_dir = cache_dir.cast<std::string>();
  if (!cache_mode.is_none()) {
    const auto text = cache_mode.cast<std::string>();
    const auto mode = parse_cache_mode(text);
    if (!mode) throw ArgumentError("configure", "cache", "rw, ro, off or strict", text);
    s.cache_mode = *mode;
  }
  if (!tune_mode.is_none()) {
    const auto text = tune_mode.cast<std::string>();
    const auto mode = parse_tune_mode(text);
    if (!mode) throw ArgumentError("configure", "tune", "off, fast or full", text);
    s.tune_mode = *mode;
  }
  jit::Runtime::get().set_settings(s);
}

py::dict stats_dict() {
  const jit::RuntimeStats s = jit::Runtime::get().stats();
  py::dict d;
  d["hot_hits"] = s.hot_hits;
  d["resolves"] = s.resolves;
  d["compiles"] = s.compiles;
  d["binary_hits"] = s.binary_hits;
  d["tunes"] = s.tunes;
  d["tuning_hits"] = s.tuning_hits;
  // The cache layer's counters of this process (every store and compile, not only op calls).
  const CacheCounters c = process_cache_counters();
  d["nvrtc_compiles"] = c.compiles;
  d["compile_ms"] = c.compile_ms;
  d["corrupt"] = c.corrupt;
  d["store_failures"] = c.store_failures;
  d["lock_waits"] = c.lock_waits;
  return d;
}

py::dict kernel_dict(const jit::Kernel& kernel) {
  py::dict d;
  d["device"] = kernel.device;
  d["op"] = std::string(op_name(kernel.problem.op));
  d["problem"] = kernel.problem.key();
  d["rows_bucket"] = kernel.bucket;
  d["config"] = kernel.config.key();
  d["heuristic_only"] = kernel.heuristic_only;
  d["from_prewarm"] = kernel.from_prewarm;
  d["in_capture"] = kernel.in_capture;
  d["programmatic"] = kernel.order == jit::StreamOrder::programmatic;
  d["binary_key"] = kernel.binary_key;
  return d;
}

py::list loaded_kernels() {
  py::list out;
  for (const jit::Kernel& kernel : jit::Runtime::get().loaded_kernels()) {
    out.append(kernel_dict(kernel));
  }
  return out;
}

// Readies, for every loaded kernel whose problem key is in `problems` (all when empty), the
// row buckets of `rows`: resolved (tuned, compiled or read from disk) and loaded, launching
// nothing. Returns how many table entries were added.
std::size_t warm_rows(const std::vector<std::string>& problems,
                      const std::vector<std::int64_t>& rows) {
  jit::Runtime& runtime = jit::Runtime::get();
  const std::vector<jit::Kernel> loaded = runtime.loaded_kernels();
  const std::size_t before = loaded.size();
  py::gil_scoped_release unlocked;  // compiles and tunes take seconds
  for (const jit::Kernel& kernel : loaded) {
    if (!problems.empty() &&
        std::find(problems.begin(), problems.end(), kernel.problem.key()) == problems.end()) {
      continue;
    }
    for (const std::int64_t count : rows) {
      if (count > 0) runtime.kernel(kernel.device, kernel.problem, count, nullptr);
    }
  }
  return runtime.loaded_kernels().size() - before;
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_C, m) {
  using namespace kiln::python;
  m.doc() = "kiln's native core: the JIT runtime, the offline compiler and the op extension.";
  // pybind11 tries translators newest first: the derived ArgumentError must come last.
  py::register_exception<kiln::Error>(m, "KilnError", PyExc_RuntimeError);
  py::register_exception<kiln::ArgumentError>(m, "ArgumentError", PyExc_ValueError);

  m.def("device_count", [] { return kiln::jit::Runtime::get().device_count(); });
  m.def("device_info",
        [](int ordinal) { return device_dict(kiln::jit::Runtime::get().device(ordinal)); });
  m.def("compile", &compile_one, py::arg("op"), py::arg("dtype"), py::arg("hidden"),
        py::arg("arch"), py::arg("weight") = true, py::arg("format") = "ptx", py::arg("align") = 16,
        py::arg("config") = py::none(), py::arg("flags") = py::none(), py::arg("rows") = py::none(),
        py::arg("aux") = 0);
  m.def("settings", &settings_dict);
  m.def("set_settings", &set_settings, py::arg("cache_dir") = py::none(),
        py::arg("cache_mode") = py::none(), py::arg("tune_mode") = py::none(),
        py::arg("record") = py::none(), py::arg("capture_mode") = py::none(),
        py::arg("pdl") = py::none());
  m.def("stats", &stats_dict);
  m.def("forget_kernels", [] { kiln::jit::Runtime::get().forget_kernels(); });
  m.def("loaded_kernels", &loaded_kernels);
  m.def("warm_rows", &warm_rows, py::arg("problems"), py::arg("rows"));
  m.def("add_library_search_dir", &kiln::jit::add_library_search_dir);
  add_cache_functions(m);
  add_report_functions(m);
  add_direct_calls(m);
}

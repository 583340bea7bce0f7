// Thin: each converts arguments, releases the GIL for the file work, and calls jit/.
#include "bindings/torch/report_module.h"

#include <pybind11/stl.h>

#include <string>

#include "cache/error.h"
#include "jit/runtime.h"
#include "jit/tuning_bundle.h"
#include "jit/tuning_pin.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

std::filesystem::path root_of(const py::object& cache_dir) {
  return cache_dir.is_none() ? jit::Runtime::get().settings().cache_dir
                             : std::filesystem::path(cache_dir.cast<std::string>());
}

std::string text_or_empty(const py::object& value) {
  return value.is_none() ? std::string() : value.cast<std::string>();
}

std::string report(const std::string& format_name, const py::object& device, const py::object& op,
                   const py::object& cache_dir) {
  const auto format = report::parse_format(format_name);
  if (!format)
    throw ArgumentError("report", "format", "\"json\", \"md\" or \"html\"",
                        "\"" + format_name + "\"");
  const report::Filter filter{text_or_empty(device), text_or_empty(op)};
  const auto root = root_of(cache_dir);
  py::gil_scoped_release unlocked;
  return jit::tuning_report(root, filter, *format);
}

py::dict transfer_dict(const jit::TuneTransfer& transfer, const char* written) {
  py::dict d;
  d[written] = transfer.written;
  d["skipped_invalid"] = transfer.skipped_invalid;
  d["failed"] = transfer.failed;
  d["kept_pinned"] = transfer.kept_pinned;
  d["problems"] = transfer.problems;
  return d;
}

py::dict tune_export(const std::string& bundle, const py::object& device,
                     const py::object& cache_dir) {
  const auto root = root_of(cache_dir);
  const std::string wanted = text_or_empty(device);
  jit::TuneTransfer transfer;
  {
    py::gil_scoped_release unlocked;
    transfer = jit::export_tuning(root, bundle, wanted);
  }
  return transfer_dict(transfer, "exported");
}

py::dict tune_import(const std::string& bundle, const py::object& cache_dir, bool pin) {
  const auto root = root_of(cache_dir);
  jit::TuneTransfer transfer;
  {
    py::gil_scoped_release unlocked;
    transfer = jit::import_tuning(root, bundle, pin);
  }
  return transfer_dict(transfer, "imported");
}

py::dict tune_pin(bool pin, const py::object& device, const py::object& op,
                  const py::object& problem, const py::object& bucket, const py::object& config,
                  const py::object& cache_dir) {
  jit::PinRequest request;
  request.pin = pin;
  request.device = text_or_empty(device);
  request.op = text_or_empty(op);
  request.problem = text_or_empty(problem);
  if (!bucket.is_none()) request.bucket = bucket.cast<std::int64_t>();
  request.config = text_or_empty(config);
  const auto root = root_of(cache_dir);
  jit::PinOutcome outcome;
  {
    py::gil_scoped_release unlocked;
    outcome = jit::set_pinned(root, request);
  }
  py::dict d;
  d["changed"] = outcome.changed;
  d["unchanged"] = outcome.unchanged;
  return d;
}

}  // namespace

void add_report_functions(py::module_& m) {
  m.def("report", &report, py::arg("format"), py::arg("device") = py::none(),
        py::arg("op") = py::none(), py::arg("cache_dir") = py::none());
  m.def("tune_export", &tune_export, py::arg("bundle"), py::arg("device") = py::none(),
        py::arg("cache_dir") = py::none());
  m.def("tune_import", &tune_import, py::arg("bundle"), py::arg("cache_dir") = py::none(),
        py::arg("pin") = false);
  m.def("tune_pin", &tune_pin, py::arg("pin"), py::arg("device"), py::arg("op"), py::arg("problem"),
        py::arg("bucket"), py::arg("config"), py::arg("cache_dir"));
}

}  // namespace kiln::python

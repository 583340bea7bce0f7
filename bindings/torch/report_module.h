// kiln._C's tuning report and tuning-result export/import.
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

void add_report_functions(pybind11::module_& m);

}  // namespace kiln::python

// kiln._C's cache functions (statistics, verify, trim, clear, export, import, prewarm).
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

void add_cache_functions(pybind11::module_& m);

}  // namespace kiln::python

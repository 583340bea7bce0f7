// kiln._C.direct: eager entries to kiln's ops that skip torch.ops' boxed call.
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

void add_direct_calls(pybind11::module_& m);

}  // namespace kiln::python

// Asking the driver what GPUs there are. Loads the driver on first use.
#pragma once

#include "jit/device.h"

namespace kiln::jit {

// The number of CUDA devices. Throws kiln::Error "kiln: no CUDA driver found: tried ..." when
// libcuda cannot be loaded and "kiln: no CUDA device ..." when the driver has none.
int device_count();

// Everything DeviceInfo holds, from the driver, for device `ordinal` (0-based). Throws
// kiln::Error for an ordinal out of range or a driver failure.
DeviceInfo probe_device(int ordinal);

}  // namespace kiln::jit

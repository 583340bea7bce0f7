// Launching a loaded kernel on the caller's stream, and asking whether that stream is being
// captured into a CUDA graph.
#pragma once

#include "jit/cuda_api.h"
#include "jit/device.h"
#include "templates/types.h"

namespace kiln::jit {

// How a launch is ordered after the kernel ahead of it on the stream. `programmatic`
// (programmatic dependent launch, sm_90 and newer) lets the driver place its CTAs while
// that kernel drains: only for kernels that wait for prior grids before they touch memory,
// as every kiln template does (templates/kiln/dependent_launch.cuh).
enum class StreamOrder { serial, programmatic };

// Makes device `ordinal`'s primary context current if it is not already (torch has usually
// made it so), then launches `function` with the kernel's single by-value parameter struct
// at `params`. A geometry with an empty grid launches nothing. Throws kiln::Error on failure.
void launch_kernel(int ordinal, CUfunction function, const LaunchGeometry& geometry,
                   const void* params, CUstream stream, StreamOrder order = StreamOrder::serial);

// Whether kiln launches programmatically on `device` (where KILN_PDL allows it): compute
// capability 9.0 or newer and a driver for CUDA 12.3 or newer.
bool supports_programmatic_launch(const DeviceInfo& device);

// Whether `stream` is being captured. An implicit-capture error (the legacy stream queried
// while another stream captures in global mode) counts as capturing: the caller must not
// tune or synchronise then either.
bool stream_is_capturing(int ordinal, CUstream stream);

}  // namespace kiln::jit

// Launching a loaded kernel on the caller's stream, and asking whether that stream is being
// captured into a CUDA graph.
#pragma once

#include "jit/cuda_api.h"
#include "templates/types.h"

namespace kiln::jit {

// Makes device `ordinal`'s primary context current if it is not already (torch has usually
// made it so), then launches `function` with the kernel's single by-value parameter struct
// at `params`. A geometry with an empty grid launches nothing. Throws kiln::Error on failure.
void launch_kernel(int ordinal, CUfunction function, const LaunchGeometry& geometry,
                   const void* params, CUstream stream);

// Whether `stream` is being captured. An implicit-capture error (the legacy stream queried
// while another stream captures in global mode) counts as capturing: the caller must not
// tune or synchronise then either.
bool stream_is_capturing(int ordinal, CUstream stream);

}  // namespace kiln::jit

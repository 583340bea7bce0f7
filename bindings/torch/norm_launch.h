// The last step of the norm ops' CUDA implementations (rms_norm's and the rest of the family's):
// the row-loop flag where a grid cannot cover the rows, the kernel's own layout of the
// parameters (pack_norm_args), and launch_op.
#pragma once

#include <ATen/core/Tensor.h>

#include "templates/kiln/norm_params.cuh"
#include "templates/types.h"

namespace kiln::torch_ops {

// `problem` without the row-loop flag, which is set here from params.rows.
void launch_norm(const at::Tensor& like, Problem problem, const NormParams& params);

}  // namespace kiln::torch_ops

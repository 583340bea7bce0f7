// The last step of every op's CUDA implementation: ask the runtime for the kernel of a
// problem on the device of `like`, on torch's current stream, and launch it. A problem the
// family rejects becomes a ValueError naming the op and argument (the runtime's words).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "templates/types.h"

namespace kiln::torch_ops {

// `params` points at the kernel's parameter struct, filled for `rows` rows.
void launch_op(const at::Tensor& like, const Problem& problem, std::int64_t rows,
               const void* params);

}  // namespace kiln::torch_ops

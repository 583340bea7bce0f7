#include "bindings/torch/norm_launch.h"

#include "bindings/torch/launch_op.h"
#include "templates/norm_family.h"

namespace kiln::torch_ops {

void launch_norm(const at::Tensor& like, Problem problem, const NormParams& params) {
  if (NormFamily::needs_row_loop(params.rows)) {
    problem.flags |= kNormRowLoop;
  }
  const NormArgBytes args = pack_norm_args(norm_features(problem), params);
  launch_op(like, problem, params.rows, args.bytes.data());
}

}  // namespace kiln::torch_ops

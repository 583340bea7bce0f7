// The CUDA implementations of the norm backward ops: validate, describe the problem, fill
// NormBackwardParams, launch kiln::norm_backward through the runtime on torch's current
// stream, then add up the kernel's fp32 partial sums (at most about
// NormBackwardFamily::kPartialElements elements) into the parameter gradients with
// kiln::sum_partials, the same family's kernel for the problem kNormSumPartials.
#include <ATen/ATen.h>

#include <array>
#include <vector>

#include "bindings/torch/launch_op.h"
#include "bindings/torch/norm.h"
#include "bindings/torch/norm_backward.h"
#include "bindings/torch/tensor_checks.h"
#include "templates/kiln/norm_backward_params.cuh"
#include "templates/norm_backward_family.h"

namespace kiln::torch_ops {
namespace {

void require_cuda(const std::string& op, const std::string& arg, const at::Tensor& x) {
  if (!x.is_cuda()) {
    fail_value(op, arg, "a CUDA tensor", x.device().str());
  }
}

// What one launch of kiln::norm_backward needs; the tensors stay the caller's.
struct BackwardCall {
  std::string op;
  Op kind = Op::rms_norm_backward;
  DType dtype = DType::f32;
  std::uint32_t flags = 0;
  const at::Tensor* dy = nullptr;
  const at::Tensor* x = nullptr;
  const at::Tensor* dr = nullptr;     // fused_add_rms_norm_backward
  const at::Tensor* scale = nullptr;  // adaln_backward
  const std::optional<at::Tensor>* weight = nullptr;
  const std::optional<at::Tensor>* table_scale = nullptr;
  std::int64_t segments = 1;  // samples, when a sum per sample is asked for
  std::int64_t tokens = 1;    // rows per sample
  double eps = 0;
};

// The kernel's outputs; partial sums are [segments * slots, hidden] fp32, undefined when the
// problem has none of that kind.
struct BackwardOutputs {
  at::Tensor dx;
  at::Tensor dscale;  // per token
  at::Tensor weight_partial;
  at::Tensor dy_partial;
  at::Tensor scale_partial;
  std::int64_t segments = 1;
  std::int64_t slots = 1;
};

BackwardOutputs run_backward(const BackwardCall& call) {
  const at::Tensor& x = *call.x;
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  const RowView xv = row_view(call.op, x);
  const std::int64_t hidden = xv.hidden;
  const Problem problem{call.kind, call.dtype, hidden, call.flags, 16};
  const auto& family = dynamic_cast<const NormBackwardFamily&>(kiln::family(call.kind));
  const unsigned features = family.features(problem);

  BackwardOutputs out;
  out.dx = at::empty(x.sizes(), contiguous);
  out.segments = call.segments;
  const std::int64_t segment_rows = xv.rows / std::max<std::int64_t>(call.segments, 1);
  out.slots = NormBackwardFamily::slots(hidden, segment_rows, call.segments);
  const std::int64_t items = out.segments * out.slots;
  // With no rows the kernel writes nothing, so the sums must start at zero.
  const auto partial = [&]() {
    const auto options = x.options().dtype(at::kFloat);
    return xv.rows == 0 ? at::zeros({items, hidden}, options) : at::empty({items, hidden}, options);
  };
  if ((features & NormBackwardFeature::weight_sum) != 0) {
    out.weight_partial = partial();
  }
  if ((features & NormBackwardFeature::dy_sum) != 0) {
    out.dy_partial = partial();
  }
  if ((features & NormBackwardFeature::scale_sum) != 0) {
    out.scale_partial = partial();
  }
  if ((features & NormBackwardFeature::scale_rows) != 0) {
    out.dscale = at::empty(x.sizes(), contiguous);
  }
  if (xv.rows == 0) {
    return out;
  }

  std::vector<at::Tensor> keep;
  std::uintptr_t bits = 0;
  const auto element = static_cast<std::uintptr_t>(dtype_size(call.dtype));
  const auto address = [&](const void* pointer) {
    bits |= reinterpret_cast<std::uintptr_t>(pointer);
    return pointer;
  };
  const auto stride = [&](std::int64_t elements) {
    bits |= static_cast<std::uintptr_t>(elements) * element;
    return elements;
  };

  NormBackwardParams p{};
  const RowView dyv = row_view(call.op, *call.dy);
  keep.push_back(dyv.tensor);
  p.dy = address(dyv.tensor.data_ptr());
  p.dy_row_stride = stride(dyv.row_stride);
  p.x = address(xv.tensor.data_ptr());
  p.x_row_stride = stride(xv.row_stride);
  p.dx = const_cast<void*>(address(out.dx.data_ptr()));
  stride(hidden);
  if (call.dr != nullptr) {
    const RowView drv = row_view(call.op, *call.dr);
    keep.push_back(drv.tensor);
    p.dr = address(drv.tensor.data_ptr());
    p.dr_row_stride = stride(drv.row_stride);
  }
  if (call.weight != nullptr && call.weight->has_value()) {
    keep.push_back((*call.weight)->contiguous());
    p.weight = address(keep.back().data_ptr());
  }
  if (call.scale != nullptr) {
    const at::Tensor& s = *call.scale;
    keep.push_back(s.stride(2) == 1 ? s : s.contiguous());
    p.scale = address(keep.back().data_ptr());
    p.scale_batch_stride = stride(keep.back().stride(0));
    p.scale_token_stride = keep.back().size(1) == 1 ? 0 : stride(keep.back().stride(1));
  }
  if (call.table_scale != nullptr && call.table_scale->has_value()) {
    keep.push_back((*call.table_scale)->contiguous());
    p.table_scale = address(keep.back().data_ptr());
  }
  if (out.dscale.defined()) {
    p.dscale = const_cast<void*>(address(out.dscale.data_ptr()));
  }
  if (out.weight_partial.defined()) {
    p.weight_partial = out.weight_partial.data_ptr<float>();
  }
  if (out.dy_partial.defined()) {
    p.dy_partial = out.dy_partial.data_ptr<float>();
  }
  if (out.scale_partial.defined()) {
    p.scale_partial = out.scale_partial.data_ptr<float>();
  }
  p.rows = xv.rows;
  p.tokens = std::max<std::int64_t>(call.tokens, 1);
  p.segments = out.segments;
  p.segment_rows = segment_rows;
  p.slots = out.slots;
  p.eps = static_cast<float>(call.eps);

  Problem aligned = problem;
  aligned.align = common_alignment({bits});
  launch_op(x, aligned, xv.rows, &p);
  return out;
}

// The partial rows ([segments * items, hidden] fp32) added up per segment into
// [segments, hidden] of the gradient's dtype by kiln::sum_partials, one launch (torch's sum
// over the rows and the cast after it took two, and twice the time); one partial row a
// segment is the sum itself, only cast.
at::Tensor sum_partials(const BackwardCall& call, const at::Tensor& partial, std::int64_t segments,
                        at::ScalarType dtype) {
  const std::int64_t hidden = partial.size(-1);
  const std::int64_t rows = partial.numel() / hidden;
  const std::int64_t items = rows / segments;
  if (items == 1) {
    return partial.view({segments, hidden}).to(dtype);
  }
  at::Tensor out = at::empty({segments, hidden}, partial.options().dtype(dtype));
  PartialSumParams p{};
  p.partial = partial.data_ptr<float>();
  p.out = out.data_ptr();
  p.items = items;
  p.segments = segments;
  launch_op(partial, Problem{call.kind, call.dtype, hidden, kNormSumPartials, 16}, rows, &p);
  return out;
}

std::optional<at::Tensor> parameter_gradient(const BackwardCall& call, const at::Tensor& partial,
                                             at::ScalarType dtype) {
  if (!partial.defined()) {
    return std::nullopt;
  }
  return sum_partials(call, partial, 1, dtype).squeeze(0);
}

std::uint32_t weight_flags(const std::optional<at::Tensor>& weight, bool weight_grad) {
  if (!weight) {
    return 0u;
  }
  return kNormWeight | (weight_grad ? 0u : kNormSkipWeightGrad);
}

}  // namespace

GradPair rms_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                const std::optional<at::Tensor>& weight, double eps,
                                bool weight_grad) {
  BackwardCall call;
  call.op = "rms_norm_backward";
  call.kind = Op::rms_norm_backward;
  call.dtype = check_norm_backward(call.op, dy, x, "x", weight);
  require_cuda(call.op, "x", x);
  call.flags = weight_flags(weight, weight_grad);
  call.dy = &dy;
  call.x = &x;
  call.weight = &weight;
  call.eps = eps;
  const BackwardOutputs out = run_backward(call);
  return {out.dx, parameter_gradient(call, out.weight_partial, x.scalar_type())};
}

GradPair fused_add_rms_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& dr,
                                          const at::Tensor& r,
                                          const std::optional<at::Tensor>& weight, double eps,
                                          bool weight_grad) {
  BackwardCall call;
  call.op = "fused_add_rms_norm_backward";
  call.kind = Op::fused_add_rms_norm_backward;
  call.dtype = check_norm_backward(call.op, dy, r, "r", weight);
  check_same_as(call.op, "dr", dr, "r", r);
  require_cuda(call.op, "r", r);
  call.flags = weight_flags(weight, weight_grad);
  call.dy = &dy;
  call.x = &r;
  call.dr = &dr;
  call.weight = &weight;
  call.eps = eps;
  const BackwardOutputs out = run_backward(call);
  return {out.dx, parameter_gradient(call, out.weight_partial, r.scalar_type())};
}

GradTriple layer_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                    const std::optional<at::Tensor>& weight,
                                    const std::optional<at::Tensor>& bias, double eps,
                                    bool weight_grad, bool bias_grad) {
  BackwardCall call;
  call.op = "layer_norm_backward";
  call.kind = Op::layer_norm_backward;
  call.dtype = check_norm_backward(call.op, dy, x, "x", weight);
  if (bias) {
    check_parameter(call.op, "bias", *bias, x);
  }
  require_cuda(call.op, "x", x);
  call.flags = weight_flags(weight, weight_grad);
  if (bias) {
    call.flags |= kNormBias | (bias_grad ? 0u : kNormSkipBiasGrad);
  }
  call.dy = &dy;
  call.x = &x;
  call.weight = &weight;
  call.eps = eps;
  const BackwardOutputs out = run_backward(call);
  return {out.dx, parameter_gradient(call, out.weight_partial, x.scalar_type()),
          parameter_gradient(call, out.dy_partial, x.scalar_type())};
}

AdaLnGrads adaln_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                               const std::optional<at::Tensor>& weight, double eps,
                               c10::string_view norm, const std::optional<at::Tensor>& table_scale,
                               bool shift_per_token, bool scale_grad, bool shift_grad,
                               bool weight_grad, bool table_scale_grad, bool table_shift_grad) {
  BackwardCall call;
  call.op = "adaln_backward";
  call.kind = Op::adaln_backward;
  const std::string kind(norm);
  call.dtype = check_adaln_backward(dy, x, scale, weight, kind, table_scale);
  require_cuda(call.op, "x", x);
  const bool scale_per_token = per_token_operand(scale, x);
  // A per-token shift's gradient is dy: nothing to compute for it.
  const bool dshift_wanted = shift_grad && !shift_per_token;
  // A table row's gradient over per-token operands is summed by torch after the kernel where
  // the row is too wide for the kernel to hold the sums.
  const bool wide = !NormBackwardFamily::table_sums_in_kernel(x.size(2));
  const bool scale_table_after = table_scale_grad && scale_per_token && wide;
  const bool shift_table_after = table_shift_grad && shift_per_token && wide;
  call.flags = weight_flags(weight, weight_grad) |
               (parse_norm_kind(call.op, kind) ? kNormLayer : 0u) |
               (table_scale ? kNormTable : 0u) | (scale_per_token ? kNormScalePerToken : 0u) |
               (shift_per_token ? kNormShiftPerToken : 0u) |
               (scale_grad || scale_table_after ? 0u : kNormSkipScaleGrad) |
               (dshift_wanted ? 0u : kNormSkipShiftGrad) |
               (table_scale_grad && !scale_table_after ? kNormTableScaleGrad : 0u) |
               (table_shift_grad && !shift_table_after ? kNormTableShiftGrad : 0u);
  call.dy = &dy;
  call.x = &x;
  call.scale = &scale;
  call.weight = &weight;
  call.table_scale = &table_scale;
  call.tokens = x.size(1);
  call.segments = NormBackwardFamily::sums_per_sample(call.flags) ? x.size(0) : 1;
  call.eps = eps;
  BackwardOutputs out = run_backward(call);

  const at::ScalarType dtype = x.scalar_type();
  const std::int64_t b = x.size(0);
  const std::int64_t d = x.size(2);
  // Per-sample sums: the partial rows of sample i are rows [i * slots, (i + 1) * slots).
  auto per_sample = [&](const at::Tensor& partial) {
    return sum_partials(call, partial, b, dtype).view({b, 1, d});
  };
  std::optional<at::Tensor> dscale;
  if (scale_grad) {
    dscale = scale_per_token ? out.dscale : per_sample(out.scale_partial);
  }
  std::optional<at::Tensor> dshift;
  if (dshift_wanted) {
    dshift = per_sample(out.dy_partial);
  }
  // A table row's gradient: every partial row summed, whatever the segments, or the
  // per-token gradient summed over samples and tokens.
  const auto over_rows = [&](const at::Tensor& per_token) {
    const std::array<std::int64_t, 2> sample_and_token{0, 1};
    return per_token.sum(sample_and_token, /*keepdim=*/false, at::kFloat).to(dtype);
  };
  std::optional<at::Tensor> dtable_scale;
  if (table_scale_grad) {
    dtable_scale = scale_table_after ? over_rows(out.dscale)
                                     : parameter_gradient(call, out.scale_partial, dtype);
  }
  std::optional<at::Tensor> dtable_shift;
  if (table_shift_grad) {
    dtable_shift =
        shift_table_after ? over_rows(dy) : parameter_gradient(call, out.dy_partial, dtype);
  }
  return {out.dx,       dscale,      dshift, parameter_gradient(call, out.weight_partial, dtype),
          dtable_scale, dtable_shift};
}

}  // namespace kiln::torch_ops

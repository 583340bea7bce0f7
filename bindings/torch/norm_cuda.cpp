// The CUDA implementations of the norm ops: validate, describe the problem, fill
// NormParams and launch kiln::norm through the runtime on torch's current stream.
#include <ATen/ATen.h>

#include <initializer_list>
#include <vector>

#include "bindings/torch/norm.h"
#include "bindings/torch/norm_launch.h"
#include "bindings/torch/tensor_checks.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/norm_family.h"

namespace kiln::torch_ops {
namespace {

void require_cuda(const std::string& op, const std::string& arg, const at::Tensor& x) {
  if (!x.is_cuda()) {
    fail_value(op, arg, "a CUDA tensor", x.device().str());
  }
}

// Addresses and byte strides the vector width must divide.
class Alignment {
 public:
  explicit Alignment(DType dtype) : element_(dtype_size(dtype)) {}
  void address(const void* pointer) { add(reinterpret_cast<std::uintptr_t>(pointer)); }
  void stride(std::int64_t elements) {
    add(static_cast<std::uintptr_t>(elements) * static_cast<std::uintptr_t>(element_));
  }
  // The operands' addresses (a null one, an operand the call does not have, counts for none)
  // and their row strides.
  void operands(std::initializer_list<const void*> pointers,
                std::initializer_list<std::int64_t> strides) {
    for (const void* pointer : pointers) {
      if (pointer != nullptr) {
        address(pointer);
      }
    }
    for (std::int64_t elements : strides) {
      stride(elements);
    }
  }
  std::uint32_t value() const { return common_alignment({bits_}); }

 private:
  void add(std::uintptr_t value) { bits_ |= value; }
  std::size_t element_;
  std::uintptr_t bits_ = 0;
};

const void* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

// A [B, 1 or T, D] operand with a unit last stride (copied otherwise); the copy, if any,
// is kept alive in `keep` until the launch.
NormModulation modulation(const at::Tensor& m, std::vector<at::Tensor>& keep, Alignment& align) {
  const at::Tensor t = m.stride(2) == 1 ? m : m.contiguous();
  keep.push_back(t);
  NormModulation result{};
  result.data = t.data_ptr();
  result.batch_stride = t.stride(0);
  result.token_stride = t.size(1) == 1 ? 0 : t.stride(1);
  align.address(result.data);
  align.stride(result.batch_stride);
  align.stride(result.token_stride);
  return result;
}

// A table row's address; fp32 rows beside 16-bit x (table_f32) are 16-byte aligned, copied
// where they are not, and so do not narrow the vectors.
const void* table_row(const std::optional<at::Tensor>& table, std::vector<at::Tensor>& keep,
                      Alignment& align, bool table_f32) {
  if (!table) {
    return nullptr;
  }
  keep.push_back(table->contiguous());
  if (table->scalar_type() == at::kFloat && table_f32 &&
      reinterpret_cast<std::uintptr_t>(keep.back().data_ptr()) % 16 != 0) {
    // The kernel reads an fp32 row 16 bytes at a time whatever x's alignment (a fresh
    // allocation is aligned; the row is D floats).
    keep.back() = keep.back().clone();
  }
  if (!table_f32) align.address(keep.back().data_ptr());
  return keep.back().data_ptr();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_cuda(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const std::optional<at::Tensor>& weight,
                                                           double eps) {
  const std::string op = "fused_add_rms_norm";
  const DType dtype = check_fused_add_rms_norm(op, x, residual, weight);
  require_cuda(op, "x", x);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty(x.sizes(), contiguous);
  at::Tensor sum = at::empty(x.sizes(), contiguous);
  const RowView xv = row_view(op, x);
  if (xv.rows == 0) {
    return {out, sum};
  }
  const RowView rv = row_view(op, residual);
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();

  NormParams p{};
  p.out = out.data_ptr();
  p.sum_out = sum.data_ptr();
  p.x = xv.tensor.data_ptr();
  p.second = rv.tensor.data_ptr();
  p.weight = data_or_null(w);
  p.rows = xv.rows;
  p.x_row_stride = xv.row_stride;
  p.second_row_stride = rv.row_stride;
  p.out_row_stride = xv.hidden;
  p.sum_row_stride = xv.hidden;
  p.eps = static_cast<float>(eps);

  Alignment align(dtype);
  align.operands({p.out, p.sum_out, p.x, p.second, p.weight},
                 {xv.row_stride, rv.row_stride, xv.hidden});
  const Problem problem{Op::fused_add_rms_norm, dtype, xv.hidden, weight ? kNormWeight : 0u,
                        align.value()};
  launch_norm(x, problem, p);
  return {out, sum};
}

at::Tensor rms_norm_gated_cuda(const at::Tensor& x, const at::Tensor& gate,
                               const std::optional<at::Tensor>& weight, double eps,
                               c10::string_view activation, bool norm_before_gate) {
  const std::string op = "rms_norm_gated";
  bool sigmoid = false;
  const DType dtype = check_rms_norm_gated(x, gate, weight, activation, sigmoid);
  require_cuda(op, "x", x);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const RowView xv = row_view(op, x);
  if (xv.rows == 0) {
    return out;
  }
  // The gate is often a slice of a wider projection (Qwen3-Next's z): read in place, by rows.
  const RowView zv = row_view(op, gate);
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();

  NormParams p{};
  p.out = out.data_ptr();
  p.x = xv.tensor.data_ptr();
  p.second = zv.tensor.data_ptr();
  p.weight = data_or_null(w);
  p.rows = xv.rows;
  p.x_row_stride = xv.row_stride;
  p.second_row_stride = zv.row_stride;
  p.out_row_stride = xv.hidden;
  p.eps = static_cast<float>(eps);

  Alignment align(dtype);
  align.operands({p.out, p.x, p.second, p.weight}, {xv.row_stride, zv.row_stride, xv.hidden});
  const std::uint32_t flags = (weight ? kNormWeight : 0u) | (sigmoid ? kNormGateSigmoid : 0u) |
                              (norm_before_gate ? 0u : kNormGateFirst);
  launch_norm(x, Problem{Op::rms_norm_gated, dtype, xv.hidden, flags, align.value()}, p);
  return out;
}

void fused_add_rms_norm_inplace_cuda(at::Tensor& x, at::Tensor& residual,
                                     const std::optional<at::Tensor>& weight, double eps) {
  const std::string op = "fused_add_rms_norm_";
  const DType dtype = check_fused_add_rms_norm(op, x, residual, weight);
  require_cuda(op, "x", x);
  const RowView xv = row_view(op, x);
  if (xv.rows == 0) {
    return;
  }
  const RowView rv = row_view(op, residual);
  // Layouts that need a copy to be seen as rows: compute aside and copy back.
  if (!xv.tensor.is_same(x) || !rv.tensor.is_same(residual)) {
    auto [out, sum] = fused_add_rms_norm_cuda(x, residual, weight, eps);
    residual.copy_(sum);
    x.copy_(out);
    return;
  }
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();
  NormParams p{};
  p.out = x.data_ptr();
  p.sum_out = residual.data_ptr();
  p.x = x.data_ptr();
  p.second = residual.data_ptr();
  p.weight = data_or_null(w);
  p.rows = xv.rows;
  p.x_row_stride = xv.row_stride;
  p.second_row_stride = rv.row_stride;
  p.out_row_stride = xv.row_stride;
  p.sum_row_stride = rv.row_stride;
  p.eps = static_cast<float>(eps);

  Alignment align(dtype);
  align.operands({p.x, p.second, p.weight}, {xv.row_stride, rv.row_stride, xv.hidden});
  const Problem problem{Op::fused_add_rms_norm, dtype, xv.hidden,
                        (weight ? kNormWeight : 0u) | kNormInPlace, align.value()};
  launch_norm(x, problem, p);
}

at::Tensor layer_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, double eps) {
  const std::string op = "layer_norm";
  const DType dtype = check_layer_norm(x, weight, bias);
  require_cuda(op, "x", x);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const RowView xv = row_view(op, x);
  if (xv.rows == 0) {
    return out;
  }
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();

  NormParams p{};
  p.out = out.data_ptr();
  p.x = xv.tensor.data_ptr();
  p.weight = data_or_null(w);
  p.bias = data_or_null(b);
  p.rows = xv.rows;
  p.x_row_stride = xv.row_stride;
  p.out_row_stride = xv.hidden;
  p.eps = static_cast<float>(eps);

  Alignment align(dtype);
  align.operands({p.out, p.x, p.weight, p.bias}, {xv.row_stride, xv.hidden});
  const std::uint32_t flags = (weight ? kNormWeight : 0u) | (bias ? kNormBias : 0u);
  launch_norm(x, Problem{Op::layer_norm, dtype, xv.hidden, flags, align.value()}, p);
  return out;
}

namespace {

// The shared body of adaln and gated_adaln (args.y set for the latter). Returns out, and
// fills `sum` with the new residual stream for gated_adaln.
at::Tensor run_adaln(const AdaLnArgs& args, double eps, at::Tensor* sum) {
  const DType dtype = check_adaln(args);
  const at::Tensor& x = *args.x;
  require_cuda(args.op, args.y != nullptr ? "h" : "x", x);
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty(x.sizes(), contiguous);
  if (sum != nullptr) {
    *sum = at::empty(x.sizes(), contiguous);
  }
  const RowView xv = row_view(args.op, x);
  if (xv.rows == 0) {
    return out;
  }

  std::vector<at::Tensor> keep;
  Alignment align(dtype);
  NormParams p{};
  p.out = out.data_ptr();
  p.x = xv.tensor.data_ptr();
  p.rows = xv.rows;
  set_tokens(p, x.size(1));
  p.x_row_stride = xv.row_stride;
  p.out_row_stride = xv.hidden;
  p.eps = static_cast<float>(eps);
  p.scale = modulation(*args.scale, keep, align);
  p.shift = modulation(*args.shift, keep, align);
  bool per_token = args.scale->size(1) > 1 || args.shift->size(1) > 1;
  if (args.y != nullptr) {
    const RowView yv = row_view(args.op, *args.y);
    keep.push_back(yv.tensor);
    p.second = yv.tensor.data_ptr();
    p.second_row_stride = yv.row_stride;
    p.gate = modulation(*args.gate, keep, align);
    per_token = per_token || args.gate->size(1) > 1;
    p.sum_out = sum->data_ptr();
    p.sum_row_stride = xv.hidden;
    align.address(p.second);
    align.address(p.sum_out);
    align.stride(p.second_row_stride);
  }
  if (args.weight->has_value()) {
    keep.push_back((*args.weight)->contiguous());
    p.weight = keep.back().data_ptr();
    align.address(p.weight);
  }
  const bool table_f32 =
      has_tables(args) && (*args.table_scale)->scalar_type() == at::kFloat && dtype != DType::f32;
  if (has_tables(args)) {
    if (args.table_gate != nullptr) {
      p.gate.table = table_row(*args.table_gate, keep, align, table_f32);
    }
    p.scale.table = table_row(*args.table_scale, keep, align, table_f32);
    p.shift.table = table_row(*args.table_shift, keep, align, table_f32);
  }
  align.address(p.out);
  align.address(p.x);
  align.stride(xv.row_stride);
  align.stride(xv.hidden);

  std::uint32_t flags = 0;
  if (args.weight->has_value()) {
    flags |= kNormWeight;
  }
  if (parse_norm_kind(args.op, args.norm)) {
    flags |= kNormLayer;
  }
  if (has_tables(args)) {
    flags |= kNormTable;
  }
  if (table_f32) {
    flags |= kNormTableF32;
  }
  if (per_token) {
    flags |= kNormPerToken;
  }
  const Op op = args.y != nullptr ? Op::gated_adaln : Op::adaln;
  launch_norm(x, Problem{op, dtype, xv.hidden, flags, align.value()}, p);
  return out;
}

}  // namespace

at::Tensor adaln_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                      const std::optional<at::Tensor>& weight, double eps, c10::string_view norm,
                      const std::optional<at::Tensor>& table_scale,
                      const std::optional<at::Tensor>& table_shift) {
  const AdaLnArgs args = adaln_args(x, scale, shift, weight, norm, table_scale, table_shift);
  return run_adaln(args, eps, nullptr);
}

std::tuple<at::Tensor, at::Tensor> gated_adaln_cuda(
    const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const std::optional<at::Tensor>& weight, double eps,
    c10::string_view norm, const std::optional<at::Tensor>& table_gate,
    const std::optional<at::Tensor>& table_scale, const std::optional<at::Tensor>& table_shift) {
  const AdaLnArgs args = gated_adaln_args(h, y, gate, scale, shift, weight, norm, table_gate,
                                          table_scale, table_shift);
  at::Tensor sum;
  at::Tensor out = run_adaln(args, eps, &sum);
  return {sum, out};
}

}  // namespace kiln::torch_ops

// The CUDA implementations of the activation ops: validate, describe each operand as a base
// address and a row stride, pick the flat or the row index space, and launch the runtime's
// kernel for the problem. The hot path allocates nothing but the output.
#include <ATen/ATen.h>

#include "bindings/torch/activation.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/launch_op.h"
#include "bindings/torch/tensor_checks.h"
#include "templates/elementwise_family.h"
#include "templates/kiln/elementwise_params.cuh"

namespace kiln::torch_ops {
namespace {

// One input of the kernel: rows of `width` elements at `data`, `row_stride` apart (0: one
// row broadcast to all). `storage` keeps a contiguous copy alive when one was needed.
// `row_elements`: what the kernel reads of a row where that is not the problem's width (an
// interleaved gate_up row holds two elements for each output element); 0 otherwise.
struct Operand {
  const char* data = nullptr;
  std::int64_t row_stride = 0;
  at::Tensor storage;
  std::int64_t row_elements = 0;
};

Operand operand(const char* op, const at::Tensor& x) {
  RowView view = row_view(op, x);
  Operand result;
  result.data = static_cast<const char*>(view.tensor.data_ptr());
  result.row_stride = view.row_stride;
  result.storage = std::move(view.tensor);
  return result;
}

void require_cuda(const char* op, const char* arg, const at::Tensor& x) {
  if (!x.is_cuda()) {
    fail_value(op, arg, "a CUDA tensor", x.device().str());
  }
}

// Fills the problem's alignment and layout flag from the operands, then resolves and
// launches. Flat when every operand (and the output) is rows of exactly `width` elements
// back to back: the kernel then ignores row boundaries and strides.
void run(const at::Tensor& like, Problem problem, std::int64_t rows, ElementwiseParams& params,
         std::initializer_list<const Operand*> inputs, bool flat_allowed) {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  bool flat = flat_allowed && (params.out_row_stride == problem.hidden || rows == 1);
  std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(params.out);
  for (const Operand* input : inputs) {
    const std::int64_t row = input->row_elements != 0 ? input->row_elements : problem.hidden;
    flat = flat && (input->row_stride == row || rows == 1);
    bits |= reinterpret_cast<std::uintptr_t>(input->data);
  }
  if (!flat) {
    for (const Operand* input : inputs) {
      bits |= static_cast<std::uintptr_t>(input->row_stride * element);
    }
    bits |= static_cast<std::uintptr_t>(params.out_row_stride * element);
    bits |= static_cast<std::uintptr_t>(problem.hidden * element);
  }
  problem.align = common_alignment({bits});
  if (flat) {
    problem.flags |= kElementwiseFlat;
  }
  if (ElementwiseFamily::needs_index64(rows * problem.hidden)) {
    problem.flags |= kElementwiseIndex64;
  }

  params.rows = rows;
  launch_op(like, problem, rows, &params);
}

// `into`, when given, is the output (of the output's shape, its rows `into_row_stride`
// elements apart); else a new tensor.
at::Tensor gated_cuda(Op op, const at::Tensor& gate, const std::optional<at::Tensor>& up,
                      bool up_first, std::uint32_t flags, const at::Tensor* into = nullptr,
                      std::int64_t into_row_stride = 0) {
  const char* name = op == Op::swiglu ? "swiglu" : "geglu";
  const DType dtype = check_gated(name, gate, up);
  require_cuda(name, "gate", gate);

  Operand g = operand(name, gate);
  Operand u;
  std::int64_t width = gate.size(-1);
  if (up) {
    u = operand(name, *up);
  } else {  // the halves of one packed row: [gate, up], or [up, gate] when up_first
    width /= 2;
    u = g;
    const std::int64_t second_half = width * static_cast<std::int64_t>(dtype_size(dtype));
    (up_first ? g : u).data += second_half;
  }
  c10::SmallVector<std::int64_t, 6> sizes(gate.sizes().begin(), gate.sizes().end());
  sizes.back() = width;
  at::Tensor out =
      into ? *into : at::empty(sizes, gate.options().memory_format(at::MemoryFormat::Contiguous));
  const std::int64_t rows = out.numel() / width;
  if (rows == 0) {
    return out;
  }

  ElementwiseParams params{};
  params.out = out.data_ptr();
  params.a = g.data;
  params.b = u.data;
  params.a_row_stride = g.row_stride;
  params.b_row_stride = u.row_stride;
  params.out_row_stride = into ? into_row_stride : width;
  // run() decides from the strides: a packed tensor's rows are 2 * width apart, so its halves
  // run flat only when it has a single row (decode).
  run(gate, Problem{op, dtype, width, flags, 16}, rows, params, {&g, &u}, true);
  return out;
}

void gated_residual_into(const char* name, const GateLayout& layout, const at::Tensor& h,
                         const at::Tensor& y, const at::Tensor& gate, void* out,
                         std::int64_t out_row_stride, std::uint32_t flags,
                         const Operand& h_operand) {
  const std::int64_t width = h.size(-1);
  const std::int64_t rows = h.numel() / width;
  const Operand y_operand = operand(name, y);
  Operand gate_operand = operand(name, gate);
  ElementwiseParams params{};
  params.rows_per_sample = make_divisor(1);
  if (layout.broadcast == GateBroadcast::shared) {
    gate_operand.row_stride = 0;
    flags |= kGateShared;
  } else if (layout.broadcast == GateBroadcast::per_sample) {
    flags |= kGatePerSample;
    params.rows_per_sample = make_divisor(static_cast<unsigned long long>(rows / h.size(0)));
  }
  params.out = out;
  params.a = h_operand.data;
  params.b = y_operand.data;
  params.c = gate_operand.data;
  params.a_row_stride = h_operand.row_stride;
  params.b_row_stride = y_operand.row_stride;
  params.c_row_stride = gate_operand.row_stride;
  params.out_row_stride = out_row_stride;
  run(h, Problem{Op::gated_residual, layout.dtype, width, flags, 16}, rows, params,
      {&h_operand, &y_operand, &gate_operand}, layout.broadcast == GateBroadcast::per_token);
}

// Writes gelu(x + bias) into rows of x's width at `out`, `out_row_stride` elements apart.
void gelu_into(const at::Tensor& x, const std::optional<at::Tensor>& bias,
               c10::string_view approximate, void* out, std::int64_t out_row_stride) {
  const DType dtype = check_gelu(x, bias);
  const bool erf = gelu_is_erf("gelu", approximate);
  require_cuda("gelu", "x", x);
  const std::int64_t width = x.size(-1);
  const std::int64_t rows = x.numel() / width;
  if (rows == 0) {
    return;
  }

  const Operand input = operand("gelu", x);
  Operand bias_operand;
  std::uint32_t flags = erf ? kGeluErf : 0u;
  ElementwiseParams params{};
  params.out = out;
  params.a = input.data;
  params.a_row_stride = input.row_stride;
  params.out_row_stride = out_row_stride;
  if (bias) {
    flags |= kGeluHasBias;
    bias_operand.storage = bias->contiguous();
    bias_operand.data = static_cast<const char*>(bias_operand.storage.data_ptr());
    bias_operand.row_stride = 0;  // one row for every row
    params.b = bias_operand.data;
    run(x, Problem{Op::gelu, dtype, width, flags, 16}, rows, params, {&input, &bias_operand},
        false);
  } else {
    run(x, Problem{Op::gelu, dtype, width, flags, 16}, rows, params, {&input}, true);
  }
}

}  // namespace

at::Tensor clamped_swiglu_cuda(const at::Tensor& gate_up, double alpha, double limit,
                               bool interleaved) {
  const char* name = "clamped_swiglu";
  const DType dtype = check_clamped_swiglu(name, gate_up, alpha, limit);
  require_cuda(name, "gate_up", gate_up);
  const std::int64_t width = gate_up.size(-1) / 2;
  c10::SmallVector<std::int64_t, 6> sizes(gate_up.sizes().begin(), gate_up.sizes().end());
  sizes.back() = width;
  at::Tensor out = at::empty(sizes, gate_up.options().memory_format(at::MemoryFormat::Contiguous));
  const std::int64_t rows = out.numel() / width;
  if (rows == 0) {
    return out;
  }

  Operand packed = operand(name, gate_up);
  ElementwiseParams params{};
  params.out = out.data_ptr();
  params.out_row_stride = width;
  params.alpha = static_cast<float>(alpha);
  params.limit = static_cast<float>(limit);
  params.a = packed.data;
  params.a_row_stride = packed.row_stride;
  if (interleaved) {
    packed.row_elements = 2 * width;
    run(gate_up, Problem{Op::clamped_swiglu, dtype, width, kPackedInterleaved, 16}, rows, params,
        {&packed}, true);
    return out;
  }
  Operand up = packed;
  up.data += width * static_cast<std::int64_t>(dtype_size(dtype));
  params.b = up.data;
  params.b_row_stride = up.row_stride;
  // As swiglu's packed halves: rows 2 * width apart, so flat only for a single row.
  run(gate_up, Problem{Op::clamped_swiglu, dtype, width, 0u, 16}, rows, params, {&packed, &up},
      true);
  return out;
}

at::Tensor swiglu_cuda(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first) {
  return gated_cuda(Op::swiglu, gate, up, up_first, 0);
}

bool swiglu_cuda_into(const at::Tensor& gate, const std::optional<at::Tensor>& up, bool up_first,
                      const at::Tensor& out) {
  const RowView rows = row_view("swiglu", out);
  if (!rows.tensor.is_same(out)) {
    return false;
  }
  gated_cuda(Op::swiglu, gate, up, up_first, 0, &out, rows.row_stride);
  return true;
}

at::Tensor geglu_cuda(const at::Tensor& gate, const std::optional<at::Tensor>& up,
                      c10::string_view approximate, bool up_first) {
  const bool erf = gelu_is_erf("geglu", approximate);
  return gated_cuda(Op::geglu, gate, up, up_first, erf ? kGeluErf : 0u);
}

at::Tensor gelu_cuda(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                     c10::string_view approximate) {
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  gelu_into(x, bias, approximate, out.data_ptr(), x.size(-1));
  return out;
}

bool gelu_cuda_into(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                    c10::string_view approximate, const at::Tensor& out) {
  const RowView rows = row_view("gelu", out);
  if (!rows.tensor.is_same(out)) {
    return false;
  }
  gelu_into(x, bias, approximate, out.data_ptr(), rows.row_stride);
  return true;
}

at::Tensor gated_residual_cuda(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate) {
  const GateLayout layout = check_gated_residual("gated_residual", h, y, gate);
  require_cuda("gated_residual", "h", h);
  at::Tensor out = at::empty(h.sizes(), h.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) {
    return out;
  }
  const Operand h_operand = operand("gated_residual", h);
  gated_residual_into("gated_residual", layout, h, y, gate, out.data_ptr(), h.size(-1), 0u,
                      h_operand);
  return out;
}

void gated_residual_inplace_cuda(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate) {
  const GateLayout layout = check_gated_residual("gated_residual_", h, y, gate);
  require_cuda("gated_residual_", "h", h);
  check_writable("gated_residual_", h, y, gate);
  if (h.numel() == 0) {
    return;
  }
  const Operand h_operand = operand("gated_residual_", h);
  if (!h_operand.storage.is_same(h)) {
    // h's rows do not collapse into one stride: compute beside it and copy back.
    h.copy_(gated_residual_cuda(h, y, gate));
    return;
  }
  gated_residual_into("gated_residual_", layout, h, y, gate, h.data_ptr(), h_operand.row_stride,
                      kGatedResidualInPlace, h_operand);
}

}  // namespace kiln::torch_ops

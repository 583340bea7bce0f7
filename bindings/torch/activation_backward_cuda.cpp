// The CUDA implementations of the activation backward ops: validate, describe every operand
// and output as a base address and a row stride, choose the flat or the row index space,
// launch the runtime's kernel; gelu with a bias then adds up the kernel's per-row-group fp32
// column sums (a small [groups, width] tensor) into dbias.
#include <ATen/ATen.h>

#include "bindings/torch/activation.h"
#include "bindings/torch/activation_backward.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/launch_op.h"
#include "bindings/torch/tensor_checks.h"
#include "templates/activation_backward_family.h"
#include "templates/kiln/activation_backward_params.cuh"

namespace kiln::torch_ops {
namespace {

// Rows of `width` elements at `data`, `row_stride` apart; `storage` keeps a contiguous copy
// alive when one was needed. `row_elements`: what the kernel reads or writes of a row where
// that is not the problem's width (an interleaved gate_up row: twice it); 0 otherwise.
struct Operand {
  char* data = nullptr;
  std::int64_t row_stride = 0;
  at::Tensor storage;
  std::int64_t row_elements = 0;
};

Operand operand(const char* op, const at::Tensor& x) {
  RowView view = row_view(op, x);
  Operand result;
  result.data = static_cast<char*>(view.tensor.data_ptr());
  result.row_stride = view.row_stride;
  result.storage = std::move(view.tensor);
  return result;
}

void require_cuda(const char* op, const char* arg, const at::Tensor& x) {
  if (!x.is_cuda()) {
    fail_value(op, arg, "a CUDA tensor", x.device().str());
  }
}

// Fills the problem's alignment and layout flag from every operand and output, then
// launches. Flat when each is rows of exactly `hidden` elements back to back.
void run(const at::Tensor& like, Problem problem, std::int64_t rows,
         ActivationBackwardParams& params, std::initializer_list<const Operand*> operands,
         bool flat_allowed) {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  bool flat = flat_allowed;
  std::uintptr_t bits = 0;
  for (const Operand* o : operands) {
    const std::int64_t row = o->row_elements != 0 ? o->row_elements : problem.hidden;
    flat = flat && (o->row_stride == row || rows == 1);
    bits |= reinterpret_cast<std::uintptr_t>(o->data);
  }
  if (!flat) {
    for (const Operand* o : operands) {
      bits |= static_cast<std::uintptr_t>(o->row_stride * element);
    }
    bits |= static_cast<std::uintptr_t>(problem.hidden * element);
  }
  problem.align = common_alignment({bits});
  if (flat) {
    problem.flags |= kElementwiseFlat;
  }
  params.rows = rows;
  launch_op(like, problem, rows, &params);
}

// A gated backward's operands: gate and up read with dy, dgate and dup written, each rows of
// the problem's width at its own address and stride.
struct GatedOperands {
  const Operand& gate;
  const Operand& up;
  const Operand& dy;
  const Operand& dgate;
  const Operand& dup;
};

// Fills `params`' addresses and strides from the operands and launches. An interleaved problem
// reads its pairs from gate's rows and writes them to dgate's (up and dup name the same rows:
// the kernel reads neither).
void run_gated(const at::Tensor& like, const Problem& problem, std::int64_t rows,
               const GatedOperands& o, bool flat_allowed, ActivationBackwardParams params) {
  params.a = o.gate.data;
  params.b = o.up.data;
  params.dy = o.dy.data;
  params.out0 = o.dgate.data;
  params.out1 = o.dup.data;
  params.a_row_stride = o.gate.row_stride;
  params.b_row_stride = o.up.row_stride;
  params.dy_row_stride = o.dy.row_stride;
  params.out0_row_stride = o.dgate.row_stride;
  params.out1_row_stride = o.dup.row_stride;
  run(like, problem, rows, params, {&o.gate, &o.up, &o.dy, &o.dgate, &o.dup}, flat_allowed);
}

std::vector<at::Tensor> gated_backward_cuda(Op op, const at::Tensor& grad_out,
                                            const at::Tensor& gate,
                                            const std::optional<at::Tensor>& up, bool up_first,
                                            std::uint32_t flags) {
  const char* name = op == Op::swiglu_backward ? "swiglu_backward" : "geglu_backward";
  const DType dtype = check_gated_backward(name, grad_out, gate, up);
  require_cuda(name, "gate", gate);
  const auto contiguous = gate.options().memory_format(at::MemoryFormat::Contiguous);
  const std::int64_t width = grad_out.size(-1);
  const std::int64_t half_bytes = width * static_cast<std::int64_t>(dtype_size(dtype));

  Operand g = operand(name, gate);
  Operand u;
  Operand dgate, dup;
  std::vector<at::Tensor> grads;
  if (up) {
    u = operand(name, *up);
    grads = {at::empty(gate.sizes(), contiguous), at::empty(up->sizes(), contiguous)};
    dgate.data = static_cast<char*>(grads[0].data_ptr());
    dup.data = static_cast<char*>(grads[1].data_ptr());
    dgate.row_stride = dup.row_stride = width;
  } else {  // the halves of one packed row, read and written: [gate, up] or [up, gate]
    u = g;
    (up_first ? g : u).data += half_bytes;
    grads = {at::empty(gate.sizes(), contiguous)};
    dgate.data = dup.data = static_cast<char*>(grads[0].data_ptr());
    (up_first ? dgate : dup).data += half_bytes;
    dgate.row_stride = dup.row_stride = 2 * width;
  }
  const std::int64_t rows = grad_out.numel() / width;
  if (rows == 0) {
    return grads;
  }
  const Operand dy = operand(name, grad_out);

  run_gated(gate, Problem{op, dtype, width, flags, 16}, rows, {g, u, dy, dgate, dup},
            up.has_value(), ActivationBackwardParams{});
  return grads;
}

}  // namespace

at::Tensor clamped_swiglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate_up,
                                        double alpha, double limit, bool interleaved) {
  const char* name = "clamped_swiglu_backward";
  const DType dtype = check_clamped_swiglu_backward(grad_out, gate_up, alpha, limit);
  require_cuda(name, "gate_up", gate_up);
  const std::int64_t width = grad_out.size(-1);
  at::Tensor grad =
      at::empty(gate_up.sizes(), gate_up.options().memory_format(at::MemoryFormat::Contiguous));
  const std::int64_t rows = grad_out.numel() / width;
  if (rows == 0) {
    return grad;
  }

  Operand packed = operand(name, gate_up);
  const Operand dy = operand(name, grad_out);
  Operand dpacked;
  dpacked.data = static_cast<char*>(grad.data_ptr());
  dpacked.row_stride = 2 * width;

  ActivationBackwardParams params{};
  params.alpha = static_cast<float>(alpha);
  params.limit = static_cast<float>(limit);
  if (interleaved) {
    packed.row_elements = dpacked.row_elements = 2 * width;
    run_gated(gate_up, Problem{Op::clamped_swiglu_backward, dtype, width, kPackedInterleaved, 16},
              rows, {packed, packed, dy, dpacked, dpacked}, true, params);
    return grad;
  }
  // The halves, read and written as swiglu_backward's packed form.
  const std::int64_t half_bytes = width * static_cast<std::int64_t>(dtype_size(dtype));
  Operand up = packed;
  up.data += half_bytes;
  Operand dup = dpacked;
  dup.data += half_bytes;
  run_gated(gate_up, Problem{Op::clamped_swiglu_backward, dtype, width, 0u, 16}, rows,
            {packed, up, dy, dpacked, dup}, false, params);
  return grad;
}

std::vector<at::Tensor> swiglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate,
                                             const std::optional<at::Tensor>& up, bool up_first) {
  return gated_backward_cuda(Op::swiglu_backward, grad_out, gate, up, up_first, 0u);
}

std::vector<at::Tensor> geglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate,
                                            const std::optional<at::Tensor>& up,
                                            c10::string_view approximate, bool up_first) {
  const bool erf = gelu_is_erf("geglu_backward", approximate);
  return gated_backward_cuda(Op::geglu_backward, grad_out, gate, up, up_first, erf ? kGeluErf : 0u);
}

std::vector<at::Tensor> gelu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& x,
                                           const std::optional<at::Tensor>& bias,
                                           c10::string_view approximate) {
  const DType dtype = check_gelu_backward(grad_out, x, bias);
  const bool erf = gelu_is_erf("gelu_backward", approximate);
  require_cuda("gelu_backward", "x", x);
  const std::int64_t width = x.size(-1);
  const std::int64_t rows = x.numel() / width;
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (rows == 0) {
    if (!bias) {
      return {dx};
    }
    return {dx, at::zeros({width}, x.options())};
  }
  const Operand input = operand("gelu_backward", x);
  const Operand dy = operand("gelu_backward", grad_out);
  Operand out;
  out.data = static_cast<char*>(dx.data_ptr());
  out.row_stride = width;

  ActivationBackwardParams params{};
  params.a = input.data;
  params.dy = dy.data;
  params.out0 = out.data;
  params.a_row_stride = input.row_stride;
  params.dy_row_stride = dy.row_stride;
  params.out0_row_stride = width;
  Problem problem{Op::gelu_backward, dtype, width, erf ? kGeluErf : 0u, 16};
  if (!bias) {
    run(x, problem, rows, params, {&input, &dy, &out}, true);
    return {dx};
  }
  problem.flags |= kGeluHasBias;
  Operand b;
  b.storage = bias->contiguous();
  b.data = static_cast<char*>(b.storage.data_ptr());
  b.row_stride = width;  // one row, read by every row (the kernel adds no row offset)
  at::Tensor partials =
      at::empty({ActivationBackwardFamily::row_groups(rows), width}, x.options().dtype(at::kFloat));
  params.b = b.data;
  params.partials = partials.data_ptr<float>();
  run(x, problem, rows, params, {&input, &b, &dy, &out}, false);
  return {dx, partials.sum(0).to(x.scalar_type())};
}

}  // namespace kiln::torch_ops

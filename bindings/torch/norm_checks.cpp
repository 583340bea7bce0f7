// Argument checks of the norm ops, shared by the CPU and CUDA implementations so both
// reject the same inputs with the same words.
#include <ATen/ATen.h>

#include "bindings/torch/norm.h"
#include "bindings/torch/tensor_checks.h"

namespace kiln::torch_ops {
namespace {

void check_rows(const std::string& op, const std::string& arg, const at::Tensor& x) {
  if (x.dim() == 0) {
    fail_value(op, arg, "at least 1 dimension", "a 0-dimensional tensor");
  }
  if (x.size(-1) <= 0) {
    fail_value(op, arg, "a last dimension (hidden size) > 0", shape_text(x));
  }
}

// Same shape, dtype and device as `like` (named `like_name` in the message).
void check_same(const std::string& op, const std::string& arg, const at::Tensor& tensor,
                const std::string& like_name, const at::Tensor& like) {
  if (tensor.device() != like.device()) {
    fail_value(op, arg, "device " + like.device().str() + " (as " + like_name + ")",
               tensor.device().str());
  }
  if (tensor.scalar_type() != like.scalar_type()) {
    fail_type(op, arg, "dtype " + dtype_text(like.scalar_type()) + " (as " + like_name + ")",
              dtype_text(tensor.scalar_type()));
  }
  if (!tensor.sizes().equals(like.sizes())) {
    fail_value(op, arg, "shape " + shape_text(like) + " (as " + like_name + ")",
               shape_text(tensor));
  }
}

// A modulation operand: x's dtype and device, shape [B, 1, D] or [B, T, D].
void check_modulation(const std::string& op, const std::string& arg, const at::Tensor& m,
                      const at::Tensor& x) {
  if (m.device() != x.device()) {
    fail_value(op, arg, "device " + x.device().str() + " (as x)", m.device().str());
  }
  if (m.scalar_type() != x.scalar_type()) {
    fail_type(op, arg, "dtype " + dtype_text(x.scalar_type()) + " (as x)",
              dtype_text(m.scalar_type()));
  }
  const std::int64_t b = x.size(0);
  const std::int64_t t = x.size(1);
  const std::int64_t d = x.size(2);
  const bool per_sample = m.dim() == 3 && m.size(0) == b && m.size(1) == 1 && m.size(2) == d;
  const bool per_token = m.dim() == 3 && m.size(0) == b && m.size(1) == t && m.size(2) == d;
  if (!per_sample && !per_token) {
    const std::string bs = std::to_string(b);
    const std::string ds = std::to_string(d);
    fail_value(op, arg,
               "shape [" + bs + ", 1, " + ds + "] (per sample) or [" + bs + ", " +
                   std::to_string(t) + ", " + ds + "] (per token) for x of shape " + shape_text(x),
               shape_text(m));
  }
}

}  // namespace

DType check_fused_add_rms_norm(const std::string& op, const at::Tensor& x,
                               const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight) {
  const DType dtype = kiln_dtype_or_cpu_double(op, "x", x);
  check_rows(op, "x", x);
  check_same(op, "residual", residual, "x", x);
  if (weight) {
    check_parameter(op, "weight", *weight, x);
  }
  return dtype;
}

DType check_rms_norm_gated(const at::Tensor& x, const at::Tensor& gate,
                           const std::optional<at::Tensor>& weight, c10::string_view activation,
                           bool& sigmoid) {
  const std::string op = "rms_norm_gated";
  const DType dtype = kiln_dtype_or_cpu_double(op, "x", x);
  check_rows(op, "x", x);
  check_same(op, "gate", gate, "x", x);
  if (weight) {
    check_parameter(op, "weight", *weight, x);
  }
  if (activation != "silu" && activation != "sigmoid") {
    fail_value(op, "activation", "\"silu\" or \"sigmoid\"", "\"" + std::string(activation) + "\"");
  }
  sigmoid = activation == "sigmoid";
  return dtype;
}

DType check_layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias) {
  const DType dtype = kiln_dtype_or_cpu_double("layer_norm", "x", x);
  check_rows("layer_norm", "x", x);
  if (weight) {
    check_parameter("layer_norm", "weight", *weight, x);
  }
  if (bias) {
    check_parameter("layer_norm", "bias", *bias, x);
  }
  return dtype;
}

bool parse_norm_kind(const std::string& op, const std::string& norm) {
  if (norm == "rms") {
    return false;
  }
  if (norm == "layer") {
    return true;
  }
  fail_value(op, "norm", "\"rms\" or \"layer\"", "\"" + norm + "\"");
}

AdaLnArgs adaln_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                     const std::optional<at::Tensor>& weight, c10::string_view norm,
                     const std::optional<at::Tensor>& table_scale,
                     const std::optional<at::Tensor>& table_shift) {
  AdaLnArgs args;
  args.op = "adaln";
  args.x = &x;
  args.scale = &scale;
  args.shift = &shift;
  args.weight = &weight;
  args.table_scale = &table_scale;
  args.table_shift = &table_shift;
  args.norm = std::string(norm);
  return args;
}

AdaLnArgs gated_adaln_args(const at::Tensor& h, const at::Tensor& y, const at::Tensor& gate,
                           const at::Tensor& scale, const at::Tensor& shift,
                           const std::optional<at::Tensor>& weight, c10::string_view norm,
                           const std::optional<at::Tensor>& table_gate,
                           const std::optional<at::Tensor>& table_scale,
                           const std::optional<at::Tensor>& table_shift) {
  AdaLnArgs args = adaln_args(h, scale, shift, weight, norm, table_scale, table_shift);
  args.op = "gated_adaln";
  args.y = &y;
  args.gate = &gate;
  args.table_gate = &table_gate;
  return args;
}

bool has_tables(const AdaLnArgs& args) {
  return args.table_scale->has_value() || args.table_shift->has_value() ||
         (args.table_gate != nullptr && args.table_gate->has_value());
}

DType check_adaln(const AdaLnArgs& args) {
  const std::string& op = args.op;
  const at::Tensor& x = *args.x;
  const std::string x_name = args.y != nullptr ? "h" : "x";
  const DType dtype = kiln_dtype_or_cpu_double(op, x_name, x);
  if (x.dim() != 3 || x.size(2) <= 0) {
    fail_value(op, x_name, "shape [B, T, D] with D > 0", shape_text(x));
  }
  parse_norm_kind(op, args.norm);
  if (args.y != nullptr) {
    check_same(op, "y", *args.y, x_name, x);
  }
  if (args.gate != nullptr) {
    check_modulation(op, "gate", *args.gate, x);
  }
  check_modulation(op, "scale", *args.scale, x);
  check_modulation(op, "shift", *args.shift, x);
  if (args.weight->has_value()) {
    check_parameter(op, "weight", **args.weight, x);
  }

  if (has_tables(args)) {
    // Table rows of x's dtype, or fp32 rows (diffusers keeps some scale_shift_tables in fp32),
    // all of one dtype.
    const at::Tensor& first = args.table_scale->has_value() ? **args.table_scale : x;
    const bool f32_rows = first.scalar_type() == at::kFloat;
    auto need = [&](const std::string& name, const std::optional<at::Tensor>& table) {
      if (!table.has_value()) {
        fail_value(op, name, "a [D] table row, since other table rows are given", "None");
      }
      if (f32_rows && table->scalar_type() != at::kFloat) {
        fail_type(op, name, "dtype float32 (as table_scale)", dtype_text(table->scalar_type()));
      }
      if (!f32_rows || x.scalar_type() == at::kFloat) {
        check_parameter(op, name, *table, x);
        return;
      }
      if (table->device() != x.device()) {
        fail_value(op, name, "device " + x.device().str() + " (as x)", table->device().str());
      }
      if (table->dim() != 1 || table->size(0) != x.size(-1)) {
        fail_value(op, name, "shape [" + std::to_string(x.size(-1)) + "] (x's last dimension)",
                   shape_text(*table));
      }
    };
    if (args.table_gate != nullptr) {
      need("table_gate", *args.table_gate);
    }
    need("table_scale", *args.table_scale);
    need("table_shift", *args.table_shift);
  }
  return dtype;
}

}  // namespace kiln::torch_ops

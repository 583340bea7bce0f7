#include "bindings/torch/tensor_checks.h"

#include <c10/util/Exception.h>

#include <string>

namespace kiln::torch_ops {

std::string dtype_text(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Double:
      return "float64";
    case c10::ScalarType::Long:
      return "int64";
    case c10::ScalarType::Int:
      return "int32";
    case c10::ScalarType::Bool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

std::string shape_text(const at::Tensor& tensor) {
  std::string text = "[";
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    text += (d ? ", " : "") + std::to_string(tensor.size(d));
  }
  return text + "]";
}

namespace {
std::string message(const std::string& op, const std::string& arg, const std::string& expected,
                    const std::string& given) {
  return "kiln." + op + ": " + arg + ": expected " + expected + ", got " + given;
}
}  // namespace

void fail_value(const std::string& op, const std::string& arg, const std::string& expected,
                const std::string& given) {
  TORCH_CHECK_VALUE(false, message(op, arg, expected, given));
  std::abort();  // unreachable: TORCH_CHECK_VALUE(false) throws
}

void fail_type(const std::string& op, const std::string& arg, const std::string& expected,
               const std::string& given) {
  TORCH_CHECK_TYPE(false, message(op, arg, expected, given));
  std::abort();
}

DType kiln_dtype(const std::string& op, const std::string& arg, const at::Tensor& x) {
  switch (x.scalar_type()) {
    case c10::ScalarType::Float:
      return DType::f32;
    case c10::ScalarType::Half:
      return DType::f16;
    case c10::ScalarType::BFloat16:
      return DType::bf16;
    default:
      fail_type(op, arg, "dtype float32, float16 or bfloat16", dtype_text(x.scalar_type()));
  }
}

DType kiln_dtype_or_cpu_double(const std::string& op, const std::string& arg, const at::Tensor& x) {
  if (x.scalar_type() == c10::ScalarType::Double && x.device().is_cpu()) {
    return DType::f32;
  }
  switch (x.scalar_type()) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
      return kiln_dtype(op, arg, x);
    default:
      fail_type(op, arg,
                x.device().is_cpu() ? "dtype float32, float16, bfloat16 or float64"
                                    : "dtype float32, float16 or bfloat16 (float64 only on CPU)",
                dtype_text(x.scalar_type()));
  }
}

void check_parameter(const std::string& op, const std::string& arg, const at::Tensor& param,
                     const at::Tensor& x) {
  if (param.device() != x.device()) {
    fail_value(op, arg, "device " + x.device().str() + " (as x)", param.device().str());
  }
  if (param.scalar_type() != x.scalar_type()) {
    fail_type(op, arg, "dtype " + dtype_text(x.scalar_type()) + " (as x)",
              dtype_text(param.scalar_type()));
  }
  const std::int64_t hidden = x.dim() == 0 ? 1 : x.size(-1);
  if (param.dim() != 1 || param.size(0) != hidden) {
    fail_value(op, arg, "shape [" + std::to_string(hidden) + "] (x's last dimension)",
               shape_text(param));
  }
}

RowView row_view(const std::string& op, const at::Tensor& x) {
  if (x.dim() == 0) fail_value(op, "x", "at least 1 dimension", "a 0-dimensional tensor");
  const std::int64_t hidden = x.size(-1);
  if (hidden <= 0) fail_value(op, "x", "a last dimension (hidden size) > 0", shape_text(x));
  RowView view;
  view.hidden = hidden;
  view.rows = x.numel() / hidden;

  // Rows collapse into one stride when every leading dimension steps by the product of the
  // dimensions after it (size-1 dimensions step by anything).
  bool collapsible = x.stride(-1) == 1 || hidden == 1;
  std::int64_t row_stride = hidden;
  const std::int64_t dims = x.dim();
  if (collapsible && dims >= 2) {
    std::int64_t expected = -1;
    for (std::int64_t d = dims - 2; d >= 0; --d) {
      if (x.size(d) == 1) continue;
      if (expected == -1) {
        row_stride = x.stride(d);
        expected = row_stride * x.size(d);
      } else if (x.stride(d) != expected) {
        collapsible = false;
        break;
      } else {
        expected *= x.size(d);
      }
    }
  }
  if (collapsible && row_stride >= hidden) {
    view.tensor = x;
    view.row_stride = row_stride;
  } else {
    view.tensor = x.contiguous();
    view.row_stride = hidden;
  }
  return view;
}

std::uint32_t common_alignment(std::initializer_list<std::uintptr_t> values) {
  std::uintptr_t bits = 16;
  for (std::uintptr_t value : values) bits |= value;
  return static_cast<std::uint32_t>(bits & (~bits + 1));  // lowest set bit
}

}  // namespace kiln::torch_ops

namespace kiln::torch_ops {

DType kernel_or_reference_dtype(const std::string& op, const std::string& arg,
                                const at::Tensor& x) {
  const bool f64 = x.scalar_type() == c10::ScalarType::Double;
  if (f64 && x.device().is_cpu()) return DType::f32;
  if (f64) {
    fail_type(op, arg, "dtype float32, float16 or bfloat16 (float64 runs on the CPU only)",
              "float64 on " + x.device().str());
  }
  if (x.device().is_cpu() && x.scalar_type() != c10::ScalarType::Float &&
      x.scalar_type() != c10::ScalarType::Half && x.scalar_type() != c10::ScalarType::BFloat16) {
    fail_type(op, arg, "dtype float32, float16, bfloat16 or (on the CPU) float64",
              dtype_text(x.scalar_type()));
  }
  return kiln_dtype(op, arg, x);
}

at::ScalarType reference_math_type(const at::Tensor& x) {
  return x.scalar_type() == c10::ScalarType::Double ? c10::ScalarType::Double
                                                    : c10::ScalarType::Float;
}

}  // namespace kiln::torch_ops

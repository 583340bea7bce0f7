// Argument checks shared by kiln's op implementations. Every failure raises the Python
// exception a user expects (TypeError for dtypes, ValueError for shapes and devices) with
// a message naming the op, the argument, what was expected and what was given.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "templates/types.h"

namespace kiln::torch_ops {

std::string dtype_text(c10::ScalarType type);      // "bfloat16", "float64", ...
std::string shape_text(const at::Tensor& tensor);  // "[2, 4096]"

[[noreturn]] void fail_value(const std::string& op, const std::string& arg,
                             const std::string& expected, const std::string& given);
[[noreturn]] void fail_type(const std::string& op, const std::string& arg,
                            const std::string& expected, const std::string& given);

// x's dtype as kiln's, or a TypeError naming the supported ones.
DType kiln_dtype(const std::string& op, const std::string& arg, const at::Tensor& x);

// As kiln_dtype, but a CPU float64 tensor passes too (reported as DType::f32, which the CPU
// references ignore: they compute in float64 for it), so torch.autograd.gradcheck can run on
// them. Every other device keeps the three kernel dtypes.
DType kiln_dtype_or_cpu_double(const std::string& op, const std::string& arg, const at::Tensor& x);

// A 1-D parameter (weight, bias) of the activation's hidden size, dtype and device.
void check_parameter(const std::string& op, const std::string& arg, const at::Tensor& param,
                     const at::Tensor& x);

// A rows x hidden view of x: the leading dimensions collapsed into rows with one row stride
// (in elements), the last dimension contiguous. Copies only when the layout cannot be
// expressed that way.
struct RowView {
  at::Tensor tensor;  // x itself, or a contiguous copy
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
  std::int64_t row_stride = 0;
};
RowView row_view(const std::string& op, const at::Tensor& x);

// The largest power of two (<= 16) dividing every address and every row stride in bytes.
std::uint32_t common_alignment(std::initializer_list<std::uintptr_t> addresses_and_strides);

}  // namespace kiln::torch_ops

namespace kiln::torch_ops {

// The dtype check of ops whose CPU implementation doubles as a float64 reference, so that
// torch.autograd.gradcheck can check their gradients: a float64 CPU tensor passes, anything
// else is checked as kiln_dtype does (a float64 CUDA tensor is a TypeError: no kernel runs in
// float64). For a float64 CPU tensor the DType returned is f32, which its CPU implementation
// ignores (see reference_math_type).
DType kernel_or_reference_dtype(const std::string& op, const std::string& arg, const at::Tensor& x);
// The type a CPU reference computes in: float64 for float64 inputs, else float32.
at::ScalarType reference_math_type(const at::Tensor& x);

}  // namespace kiln::torch_ops

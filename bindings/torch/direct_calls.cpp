// kiln._C.direct: eager entries to kiln's ops that skip torch.ops' boxed call.
//
// A call of torch.ops.kiln.<op>.default packs its Python arguments into IValues against the
// op's schema and runs the boxed kernel. On the H200's host that path costs about 1.5 us more
// than ATen's generated bindings (torch.ops.aten.gelu.default 7.7 us, F.gelu 6.1 us, side by
// side), which at decode sizes is most of a call. These entries convert each argument
// straight to its C++ type and call the dispatcher's typed handle, so the same dispatch runs
// (autograd, autocast, inference mode, tracing, Python dispatch modes, then the CUDA or CPU
// kernel), without the boxing. An argument that overrides __torch_function__, or an active
// torch function mode, sends the call through torch.ops as before, so subclasses, FX proxies
// and modes still see the op. The Python spellings use these outside torch.compile only.
#include "bindings/torch/direct_calls.h"

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace py = pybind11;

namespace kiln::python {
namespace {

// Whether a tensor argument asks for __torch_function__: a subclass whose __torch_function__
// is not torch's disabled one (nn.Parameter disables it), or any tensor while a torch
// function mode is active. torch's own check is not exported to extensions.
bool overrides_torch_function(PyObject* tensor) {
  if (at::impl::torch_function_mode_enabled()) {
    return true;
  }
  if (THPVariable_CheckExact(tensor)) {
    return false;
  }
  static PyObject* const disabled =
      py::object(py::module_::import("torch").attr("_C").attr("_disabled_torch_function_impl"))
          .release()
          .ptr();
  const py::object impl = py::getattr(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(tensor))),
                                      "__torch_function__", py::none());
  return impl.ptr() != disabled;
}

// What converting a call's arguments found: whether one asks for __torch_function__.
struct Conversion {
  const char* op;
  const c10::FunctionSchema* schema;
  bool overridden = false;

  [[noreturn]] void wrong_type(std::size_t index, const char* expected, py::handle given) const {
    throw py::type_error("kiln." + std::string(op) + ": argument '" +
                         schema->arguments()[index].name() + "': expected " + expected + ", got " +
                         std::string(py::str(py::type::handle_of(given).attr("__name__"))));
  }

  at::Tensor tensor(std::size_t index, py::handle value) {
    if (!THPVariable_Check(value.ptr())) {
      wrong_type(index, "a Tensor", value);
    }
    overridden = overridden || overrides_torch_function(value.ptr());
    return THPVariable_Unpack(value.ptr());
  }
};

// One argument held in the C++ type the kernel takes, converted from Python.
template <typename T>
struct Held;

template <>
struct Held<const at::Tensor&> {
  at::Tensor value;
  Held(Conversion& c, std::size_t i, py::handle h) : value(c.tensor(i, h)) {}
  const at::Tensor& get() const { return value; }
};

template <>
struct Held<at::Tensor&> {
  at::Tensor value;
  Held(Conversion& c, std::size_t i, py::handle h) : value(c.tensor(i, h)) {}
  at::Tensor& get() { return value; }
};

template <>
struct Held<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> value;
  Held(Conversion& c, std::size_t i, py::handle h) {
    if (!h.is_none()) {
      value = c.tensor(i, h);
    }
  }
  const std::optional<at::Tensor>& get() const { return value; }
};

template <>
struct Held<double> {
  double value;
  Held(Conversion& c, std::size_t i, py::handle h) {
    if (!PyFloat_Check(h.ptr()) && !PyLong_Check(h.ptr())) {
      c.wrong_type(i, "a float", h);
    }
    value = PyFloat_AsDouble(h.ptr());
  }
  double get() const { return value; }
};

template <>
struct Held<bool> {
  bool value;
  Held(Conversion& c, std::size_t i, py::handle h) {
    if (!PyBool_Check(h.ptr())) {
      c.wrong_type(i, "a bool", h);
    }
    value = h.ptr() == Py_True;
  }
  bool get() const { return value; }
};

template <>
struct Held<std::int64_t> {
  std::int64_t value;
  Held(Conversion& c, std::size_t i, py::handle h) {
    if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) {
      c.wrong_type(i, "an int", h);
    }
    value = h.cast<std::int64_t>();
  }
  std::int64_t get() const { return value; }
};

template <>
struct Held<std::string_view> {
  std::string value;
  Held(Conversion& c, std::size_t i, py::handle h) {
    if (!PyUnicode_Check(h.ptr())) {
      c.wrong_type(i, "a str", h);
    }
    value = h.cast<std::string>();
  }
  std::string_view get() const { return value; }
};

// The op's typed dispatcher handle and, for overridden arguments, its torch.ops overload.
template <typename Signature>
class DirectOp;

template <typename Return, typename... Args>
class DirectOp<Return(Args...)> {
 public:
  DirectOp(const char* op, const char* overload) : op_(op), overload_(overload) {}

  py::object operator()(const py::args& args) {
    if (!handle_) {
      handle_ = c10::Dispatcher::singleton()
                    .findSchemaOrThrow(("kiln::" + std::string(op_)).c_str(), overload_)
                    .template typed<Return(Args...)>();
    }
    if (args.size() != sizeof...(Args)) {
      throw py::type_error("kiln." + std::string(op_) + ": expected " +
                           std::to_string(sizeof...(Args)) + " arguments, got " +
                           std::to_string(args.size()));
    }
    return call(args, std::index_sequence_for<Args...>{});
  }

 private:
  template <std::size_t... I>
  py::object call(const py::args& args, std::index_sequence<I...> /*indices*/) {
    Conversion conversion{op_, &handle_->schema()};
    // Braced initialisation converts the arguments left to right.
    std::tuple<Held<Args>...> held{Held<Args>(conversion, I, args[I])...};
    if (conversion.overridden) {
      return through_torch_ops(args);
    }
    if constexpr (std::is_void_v<Return>) {
      {
        py::gil_scoped_release unlocked;
        handle_->call(std::get<I>(held).get()...);
      }
      return py::none();
    } else {
      Return result;
      {
        py::gil_scoped_release unlocked;
        result = handle_->call(std::get<I>(held).get()...);
      }
      return py::cast(std::move(result));
    }
  }

  // The boxed path, keyword-only arguments (an out= tensor) passed by name.
  py::object through_torch_ops(const py::args& args) const {
    py::object overload = py::module_::import("torch").attr("ops").attr("kiln").attr(op_).attr(
        *overload_ != '\0' ? overload_ : "default");
    py::list positional;
    py::dict named;
    const auto& arguments = handle_->schema().arguments();
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (arguments[i].kwarg_only()) {
        named[py::str(arguments[i].name())] = args[i];
      } else {
        positional.append(args[i]);
      }
    }
    return overload(*py::tuple(positional), **named);
  }

  const char* op_;
  const char* overload_;
  std::optional<c10::TypedOperatorHandle<Return(Args...)>> handle_;
};

template <typename Signature>
void add(py::module_& m, const char* name, const char* op, const char* overload = "") {
  m.def(name, DirectOp<Signature>(op, overload));
}

using Tensor = const at::Tensor&;
using MutableTensor = at::Tensor&;
using OptionalTensor = const std::optional<at::Tensor>&;
using TensorPair = std::tuple<at::Tensor, at::Tensor>;
using Str = std::string_view;

}  // namespace

void add_direct_calls(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "direct", "Eager entries to kiln's ops that skip torch.ops' boxed call (same dispatch).");
  add<at::Tensor(Tensor, OptionalTensor, double)>(m, "rms_norm", "rms_norm");
  add<void(Tensor, OptionalTensor, double, Tensor)>(m, "rms_norm_out", "rms_norm", "out");
  add<TensorPair(Tensor, Tensor, OptionalTensor, double)>(m, "fused_add_rms_norm",
                                                          "fused_add_rms_norm");
  add<void(MutableTensor, MutableTensor, OptionalTensor, double)>(m, "fused_add_rms_norm_",
                                                                  "fused_add_rms_norm_");
  add<at::Tensor(Tensor, OptionalTensor, OptionalTensor, double)>(m, "layer_norm", "layer_norm");
  add<at::Tensor(Tensor, Tensor, Tensor, OptionalTensor, double, Str, OptionalTensor,
                 OptionalTensor)>(m, "adaln", "adaln");
  add<TensorPair(Tensor, Tensor, Tensor, Tensor, Tensor, OptionalTensor, double, Str,
                 OptionalTensor, OptionalTensor, OptionalTensor)>(m, "gated_adaln", "gated_adaln");
  add<at::Tensor(Tensor, Tensor, OptionalTensor, double, Str, bool)>(m, "rms_norm_gated",
                                                                     "rms_norm_gated");
  add<at::Tensor(Tensor, OptionalTensor, bool)>(m, "swiglu", "swiglu");
  add<void(Tensor, OptionalTensor, bool, Tensor)>(m, "swiglu_out", "swiglu", "out");
  add<at::Tensor(Tensor, OptionalTensor, Str, bool)>(m, "geglu", "geglu");
  add<at::Tensor(Tensor, double, double, bool)>(m, "clamped_swiglu", "clamped_swiglu");
  add<at::Tensor(Tensor, OptionalTensor, Str)>(m, "gelu", "gelu");
  add<void(Tensor, OptionalTensor, Str, Tensor)>(m, "gelu_out", "gelu", "out");
  add<at::Tensor(Tensor, Tensor, Tensor)>(m, "gated_residual", "gated_residual");
  add<void(Tensor, Tensor, Tensor)>(m, "gated_residual_", "gated_residual_");
  add<TensorPair(Tensor, Tensor, Tensor, Tensor, bool, std::int64_t, Str, std::int64_t, bool)>(
      m, "rope", "rope");
  add<void(Tensor, Tensor, Tensor, Tensor, bool, std::int64_t, Str, std::int64_t, bool)>(m, "rope_",
                                                                                         "rope_");
  add<TensorPair(Tensor, Tensor, OptionalTensor, OptionalTensor, Tensor, Tensor, double, bool,
                 std::int64_t, Str, std::int64_t)>(m, "head_norm_rope", "head_norm_rope");
  add<void(Tensor, Tensor, OptionalTensor, OptionalTensor, Tensor, Tensor, double, bool,
           std::int64_t, Str, std::int64_t)>(m, "head_norm_rope_", "head_norm_rope_");
}

}  // namespace kiln::python

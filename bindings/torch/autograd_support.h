// Pieces shared by the ops' autograd kernels (autograd_norm.cpp, autograd_pointwise.cpp).
//
// The autograd kernels are C++ so that an inference call never enters Python: a formula
// registered from Python (torch.library.register_autograd) runs a Python function on every
// call, grad or not, which tripled the host time of a small swiglu call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kiln::torch_ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline bool requires_grad(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}
inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}

// Whether a forward-mode AD tangent rides on the argument (torch.autograd.forward_ad,
// torch.func.jvp).
inline bool has_tangent(const at::Tensor& t) {
  return t.defined() && t._fw_grad(/*level=*/0).defined();
}
inline bool has_tangent(const std::optional<at::Tensor>& t) {
  return t.has_value() && has_tangent(*t);
}
template <typename T>
bool has_tangent(const T& /*not a tensor*/) {
  return false;
}

// The names of the op's arguments that `marks` marks, in the schema's order ("h, y"), and
// the same followed by the verb agreeing with them ("y requires" / "q, k require").
std::string argument_names(const c10::OperatorHandle& op, const std::vector<bool>& marks);
std::string argument_names(const c10::OperatorHandle& op, const std::vector<bool>& marks,
                           std::string_view one, std::string_view many);

// kiln's ops have no forward-mode derivatives. As torch's own ops without one, a tangent
// raises NotImplementedError naming the op and the arguments carrying it (`args` in the
// schema's order), rather than the output coming back without one.
[[noreturn]] void fail_tangents(const c10::OperatorHandle& op, const std::vector<bool>& carrying);
template <typename... Args>
void refuse_tangents(const c10::OperatorHandle& op, const Args&... args) {
  if ((has_tangent(args) || ...)) {
    fail_tangents(op, {has_tangent(args)...});
  }
}

// Whether autograd must record this call: grad mode is on and some input requires grad.
template <typename... Inputs>
bool records_grad(const Inputs&... inputs) {
  return at::GradMode::is_enabled() && (requires_grad(inputs) || ...);
}

// The kiln op `name`, typed with the C++ signature of one of its implementations (`Impl`),
// looked up once. Called through the dispatcher (below autograd inside a
// torch::autograd::Function's forward, or inside an AutoDispatchBelowADInplaceOrView guard)
// so fake tensors, functionalization and the device kernels all see it.
template <auto& Impl>
const auto& kiln_op(const char* name) {
  using Signature = std::remove_reference_t<decltype(Impl)>;
  static const c10::TypedOperatorHandle<Signature> op =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
  return op;
}

// An optional tensor from one saved for backward (saved undefined when it was absent).
inline std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

inline at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// Whether backward must return a gradient for the forward's tensor argument at `position`
// (counting every tensor argument, optional or not; `given` says which were passed). Autograd
// numbers its input edges over the tensors that were passed only, so an absent optional
// shifts the ones after it; a frozen parameter (requires_grad false) has an edge that wants
// nothing.
inline bool wants_grad(const AutogradContext* ctx, std::initializer_list<bool> given,
                       std::size_t position) {
  if (!std::data(given)[position]) {
    return false;
  }
  std::size_t edge = 0;
  for (std::size_t i = 0; i < position; ++i) {
    edge += std::data(given)[i] ? 1 : 0;
  }
  return ctx->needs_input_grad(edge);
}

}  // namespace kiln::torch_ops

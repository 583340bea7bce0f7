// The autograd kernels of the ops that have no backward: the fused inference ops
// (gated_adaln, gated_residual, rms_norm_rope, head_norm_rope, rope_3d, rms_norm_gated), the
// in-place and out= forms, and the backward ops themselves.
//
// Without a kernel of its own, such an op meets torch's fallback for custom ops, which boxes
// every call and runs the op with autograd still on: the CPU reference then records its own
// internal ops (a graph that only the CPU has), while on CUDA a backward through the output
// silently gives no gradient, and a CUDA kernel writing in place leaves the tensor's version
// counter where it was, so autograd cannot see that a saved tensor changed. These typed
// kernels run each call below autograd on every device; where autograd records, a functional
// op's outputs get a node that raises at backward, naming the op and the inputs that wanted a
// gradient (as torch's own ops without a derivative do), and an in-place or out= form is
// refused at once; a forward-mode tangent is refused too, never dropped. The written tensors'
// versions are bumped at ADInplaceOrView, which also runs under inference mode for ordinary
// tensors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/torch/activation.h"
#include "bindings/torch/activation_backward.h"
#include "bindings/torch/autograd_support.h"
#include "bindings/torch/clamped_swiglu.h"
#include "bindings/torch/norm.h"
#include "bindings/torch/norm_backward.h"
#include "bindings/torch/rope.h"

namespace kiln::torch_ops {
namespace {

// An op's name as a template argument: "rope_3d", or "rms_norm.out" for an overload.
template <std::size_t N>
struct OpName {
  char text[N];  // NOLINT(modernize-avoid-c-arrays): a literal's characters, kept at compile time
  constexpr OpName(const char (&name)[N]) { std::copy_n(name, N, text); }  // NOLINT
  std::string_view view() const { return {text, N - 1}; }
};

// Whether an argument of any type requires grad (only a tensor can).
template <typename T>
bool argument_requires_grad(const T& argument) {
  if constexpr (std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::optional<at::Tensor>>) {
    return requires_grad(argument);
  } else {
    return false;
  }
}

void add_tensor(std::vector<at::Tensor>& to, const at::Tensor& t) {
  if (t.defined()) {
    to.push_back(t);
  }
}
void add_tensor(std::vector<at::Tensor>& to, const std::optional<at::Tensor>& t) {
  if (t) {
    add_tensor(to, *t);
  }
}
template <typename T>
void add_tensor(std::vector<at::Tensor>& /*to*/, const T& /*not a tensor*/) {}

// Every tensor an op returns, whatever the container.
template <typename Visit>
void each_output(const at::Tensor& t, Visit&& visit) {
  if (t.defined()) {
    visit(t);
  }
}
template <typename Visit>
void each_output(const std::optional<at::Tensor>& t, Visit&& visit) {
  if (t) {
    each_output(*t, visit);
  }
}
template <typename Visit>
void each_output(const std::vector<at::Tensor>& ts, Visit&& visit) {
  for (const at::Tensor& t : ts) {
    each_output(t, visit);
  }
}
template <typename Visit, typename... Ts>
void each_output(const std::tuple<Ts...>& ts, Visit&& visit) {
  std::apply([&](const auto&... t) { (each_output(t, visit), ...); }, ts);
}

void bump_version(const at::Tensor& t) {
  if (t.defined()) {
    torch::autograd::increment_version(t);
  }
}
template <typename T>
void bump_version(const T& /*not a tensor*/) {}

// What computes the same with a backward, where a gradient is wanted.
std::string instead(std::string_view op) {
  if (op.ends_with("_backward")) {
    return "double backward through kiln's ops is not supported";
  }
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 13> kInstead{{
      {"rope_", "kiln.rope has a backward"},
      {"fused_add_rms_norm_", "kiln.fused_add_rms_norm has a backward"},
      {"rms_norm.out", "kiln.rms_norm without out= has a backward"},
      {"swiglu.out", "kiln.swiglu without out= has a backward"},
      {"gelu.out", "kiln.gelu without out= has a backward"},
      {"gated_residual", "h + y * gate in torch ops has one"},
      {"gated_residual_", "h + y * gate in torch ops has one"},
      {"head_norm_rope", "kiln.rms_norm over each head, then kiln.rope, have backward passes"},
      {"head_norm_rope_", "kiln.rms_norm over each head, then kiln.rope, have backward passes"},
      {"rms_norm_rope", "kiln.rms_norm of q and of k, then kiln.rope, have backward passes"},
      {"gated_adaln", "the gated residual in torch ops, then kiln.adaln, have backward passes"},
      {"rope_3d", "kiln.rope with diffusers' LTX-Video table has a backward"},
      {"rms_norm_gated", "kiln.rms_norm, then the gate in torch ops, have backward passes"},
  }};
  for (const auto& [name, text] : kInstead) {
    if (name == op) {
      return std::string(text);
    }
  }
  return "kiln's differentiable ops have backward passes";
}

// The op `Name`, whose kernels have the C++ signature `Signature`.
template <OpName Name, typename Signature>
struct NoBackward;

template <OpName Name, typename Return, typename... Args>
struct NoBackward<Name, Return(Args...)> {
  static const c10::TypedOperatorHandle<Return(Args...)>& op() {
    static const auto handle = [] {
      const std::string_view name = Name.view();
      const std::size_t dot = name.find('.');
      const std::string overload =
          dot == std::string_view::npos ? "" : std::string(name.substr(dot + 1));
      return c10::Dispatcher::singleton()
          .findSchemaOrThrow(("kiln::" + std::string(name.substr(0, dot))).c_str(),
                             overload.c_str())
          .template typed<Return(Args...)>();
    }();
    return handle;
  }

  // Which arguments the schema marks written (Tensor(a!)).
  static const std::vector<bool>& written() {
    static const std::vector<bool> marks = [] {
      std::vector<bool> out;
      for (const c10::Argument& argument : op().schema().arguments()) {
        out.push_back(argument.alias_info() != nullptr && argument.alias_info()->isWrite());
      }
      return out;
    }();
    return marks;
  }

  // The names of the arguments that require grad: "h, y".
  static std::string wanting_grad(const Args&... args) {
    return argument_names(op(), {argument_requires_grad(args)...});
  }

  static Return autograd(c10::DispatchKeySet keys, Args... args) {
    refuse_tangents(op(), args...);
    const bool records = at::GradMode::is_enabled() && (argument_requires_grad(args) || ...);
    // kiln's schemas that return nothing are the in-place and out= forms.
    if constexpr (std::is_void_v<Return>) {
      if (records) {
        refuse_recorded_write(args...);
      }
      const at::AutoDispatchBelowAutograd below;
      op().redispatch(keys & c10::after_autograd_keyset, args...);
    } else {
      if (!records) {
        const at::AutoDispatchBelowADInplaceOrView below;
        return op().redispatch(keys & c10::after_ADInplaceOrView_keyset, args...);
      }
      return recorded(keys, args...);
    }
  }

  // An in-place or out= call that autograd would record: refused before anything is written.
  // Where a written tensor is itself in a graph, no_grad would cut it out of it silently, so
  // only the form with a backward is offered.
  [[noreturn]] static void refuse_recorded_write(const Args&... args) {
    const std::vector<bool> wanting{argument_requires_grad(args)...};
    std::vector<bool> written_wanting(wanting.size());
    for (std::size_t i = 0; i < wanting.size(); ++i) {
      written_wanting[i] = wanting[i] && written()[i];
    }
    const std::string head = "kiln." + std::string(Name.view()) + " writes " +
                             argument_names(op(), written()) +
                             " in place and has no backward, but ";
    if (std::find(written_wanting.begin(), written_wanting.end(), true) != written_wanting.end()) {
      TORCH_CHECK(false, head, argument_names(op(), written_wanting, "requires", "require"),
                  " grad: writing in place would cut it from its graph; ", instead(Name.view()),
                  ".");
    }
    TORCH_CHECK(false, head, "autograd records this call (",
                argument_names(op(), wanting, "requires", "require"),
                " grad): call it under torch.no_grad() or torch.inference_mode() where no "
                "gradient is wanted; ",
                instead(Name.view()), ".");
    std::abort();  // unreachable: TORCH_CHECK(false) throws
  }

  // A recorded call: the outputs' backward raises, naming the inputs that wanted a gradient.
  static Return recorded(c10::DispatchKeySet keys, Args... args) {
    std::vector<at::Tensor> inputs;
    (add_tensor(inputs, args), ...);
    const std::shared_ptr<torch::autograd::Error> grad_fn(
        new torch::autograd::Error(
            "kiln." + std::string(Name.view()) +
                " has no backward: no gradient flows through it to " + wanting_grad(args...) +
                ". Call it under torch.no_grad() where no gradient is wanted; " +
                instead(Name.view()) + ".",
            torch::autograd::collect_next_edges(inputs)),
        torch::autograd::deleteNode);
    Return result = [&] {
      const at::AutoDispatchBelowADInplaceOrView below;
      return op().redispatch(keys & c10::after_ADInplaceOrView_keyset, args...);
    }();
    each_output(result, [&](const at::Tensor& t) {
      if (torch::autograd::isDifferentiableType(t.scalar_type())) {
        torch::autograd::set_history(const_cast<at::Tensor&>(t), grad_fn);
      }
    });
    return result;
  }

  // In-place and out= forms: the kernel, then each written tensor's version bumped once.
  static void inplace_or_view(c10::DispatchKeySet keys, Args... args) {
    static_assert(std::is_void_v<Return>, "kiln's in-place and out= schemas return nothing");
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      op().redispatch(keys & c10::after_ADInplaceOrView_keyset, args...);
    }
    std::size_t i = 0;
    ((written()[i++] ? bump_version(args) : void()), ...);
  }
};

template <OpName Name, auto& Impl>
using NoBackwardOf = NoBackward<Name, std::remove_reference_t<decltype(Impl)>>;

// The out= forms' kernels are local to out_variants.cpp; their signature is spelled here.
using OutSignature = void(const at::Tensor&, const std::optional<at::Tensor>&, double,
                          const at::Tensor&);
using SwigluOutSignature = void(const at::Tensor&, const std::optional<at::Tensor>&, bool,
                                const at::Tensor&);
using GeluOutSignature = void(const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                              const at::Tensor&);

}  // namespace
}  // namespace kiln::torch_ops

TORCH_LIBRARY_IMPL(kiln, Autograd, m) {
  using namespace kiln::torch_ops;  // NOLINT(google-build-using-namespace): registration only
  m.impl("gated_adaln", &NoBackwardOf<"gated_adaln", gated_adaln_cpu>::autograd);
  m.impl("gated_residual", &NoBackwardOf<"gated_residual", gated_residual_cpu>::autograd);
  m.impl("rms_norm_rope", &NoBackwardOf<"rms_norm_rope", rms_norm_rope_cpu>::autograd);
  m.impl("head_norm_rope", &NoBackwardOf<"head_norm_rope", head_norm_rope_cpu>::autograd);
  m.impl("rope_3d", &NoBackwardOf<"rope_3d", rope_3d_cpu>::autograd);
  m.impl("rms_norm_gated", &NoBackwardOf<"rms_norm_gated", rms_norm_gated_cpu>::autograd);
  m.impl("rope_backward", &NoBackwardOf<"rope_backward", rope_backward_cpu>::autograd);
  m.impl("swiglu_backward", &NoBackwardOf<"swiglu_backward", swiglu_backward_cpu>::autograd);
  m.impl("geglu_backward", &NoBackwardOf<"geglu_backward", geglu_backward_cpu>::autograd);
  m.impl("gelu_backward", &NoBackwardOf<"gelu_backward", gelu_backward_cpu>::autograd);
  m.impl("clamped_swiglu_backward",
         &NoBackwardOf<"clamped_swiglu_backward", clamped_swiglu_backward_cpu>::autograd);
  m.impl("rms_norm_backward", &NoBackwardOf<"rms_norm_backward", rms_norm_backward_cpu>::autograd);
  m.impl("fused_add_rms_norm_backward",
         &NoBackwardOf<"fused_add_rms_norm_backward", fused_add_rms_norm_backward_cpu>::autograd);
  m.impl("layer_norm_backward",
         &NoBackwardOf<"layer_norm_backward", layer_norm_backward_cpu>::autograd);
  m.impl("adaln_backward", &NoBackwardOf<"adaln_backward", adaln_backward_cpu>::autograd);
  m.impl("rope_", &NoBackwardOf<"rope_", rope_inplace_cpu>::autograd);
  m.impl("head_norm_rope_", &NoBackwardOf<"head_norm_rope_", head_norm_rope_inplace_cpu>::autograd);
  m.impl("fused_add_rms_norm_",
         &NoBackwardOf<"fused_add_rms_norm_", fused_add_rms_norm_inplace_cpu>::autograd);
  m.impl("gated_residual_", &NoBackwardOf<"gated_residual_", gated_residual_inplace_cpu>::autograd);
  m.impl("rms_norm.out", &NoBackward<"rms_norm.out", OutSignature>::autograd);
  m.impl("swiglu.out", &NoBackward<"swiglu.out", SwigluOutSignature>::autograd);
  m.impl("gelu.out", &NoBackward<"gelu.out", GeluOutSignature>::autograd);
}

TORCH_LIBRARY_IMPL(kiln, ADInplaceOrView, m) {
  using namespace kiln::torch_ops;  // NOLINT(google-build-using-namespace): registration only
  m.impl("rope_", &NoBackwardOf<"rope_", rope_inplace_cpu>::inplace_or_view);
  m.impl("head_norm_rope_",
         &NoBackwardOf<"head_norm_rope_", head_norm_rope_inplace_cpu>::inplace_or_view);
  m.impl("fused_add_rms_norm_",
         &NoBackwardOf<"fused_add_rms_norm_", fused_add_rms_norm_inplace_cpu>::inplace_or_view);
  m.impl("gated_residual_",
         &NoBackwardOf<"gated_residual_", gated_residual_inplace_cpu>::inplace_or_view);
  m.impl("rms_norm.out", &NoBackward<"rms_norm.out", OutSignature>::inplace_or_view);
  m.impl("swiglu.out", &NoBackward<"swiglu.out", SwigluOutSignature>::inplace_or_view);
  m.impl("gelu.out", &NoBackward<"gelu.out", GeluOutSignature>::inplace_or_view);
}

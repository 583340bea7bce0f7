// The out-of-line half of autograd_support.h: the forward-mode refusal's message.
#include "bindings/torch/autograd_support.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace kiln::torch_ops {

std::string argument_names(const c10::OperatorHandle& op, const std::vector<bool>& marks) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  std::string names;
  for (std::size_t i = 0; i < marks.size() && i < arguments.size(); ++i) {
    if (marks[i]) {
      names += (names.empty() ? "" : ", ") + arguments[i].name();
    }
  }
  return names;
}

std::string argument_names(const c10::OperatorHandle& op, const std::vector<bool>& marks,
                           std::string_view one, std::string_view many) {
  const auto count = std::count(marks.begin(), marks.end(), true);
  return argument_names(op, marks) + " " + std::string(count == 1 ? one : many);
}

void fail_tangents(const c10::OperatorHandle& op, const std::vector<bool>& carrying) {
  std::string op_name = op.schema().name();
  if (op_name.starts_with("kiln::")) {
    op_name = op_name.substr(6);
  }
  if (!op.schema().overload_name().empty()) {
    op_name += "." + op.schema().overload_name();
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "kiln.", op_name, " has no forward-mode derivative, but ",
                              argument_names(op, carrying, "carries", "carry"),
                              " a tangent (torch.autograd.forward_ad, torch.func.jvp)");
  std::abort();  // unreachable: TORCH_CHECK_NOT_IMPLEMENTED(false) throws
}

}  // namespace kiln::torch_ops

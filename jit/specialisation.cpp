#include "jit/specialisation.h"

#include <charconv>
#include <string>

#include "jit/runtime.h"
#include "templates/rms_norm_family.h"
#include "tuner/tuner.h"

namespace kiln::jit {

int parse_arch(std::string_view text) {
  std::string digits;
  for (char c : text.starts_with("sm_")  ? text.substr(3)
                : text.starts_with("sm") ? text.substr(2)
                                         : text) {
    if (c != '.') {
      digits.push_back(c);
    }
  }
  int sm = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), sm);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || sm < 10) {
    throw ArgumentError("compile", "arch", "an arch such as sm_90", "'" + std::string(text) + "'");
  }
  return sm;
}

void set_target_arch(SpecialisationSpec& spec, std::string_view arch) {
  if (arch == "native") {
    const DeviceInfo& device = Runtime::get().device(0);
    spec.sm = device.sm();
    spec.traits = device.traits();
  } else {
    spec.sm = parse_arch(arch);
    spec.traits.reset();
  }
}

CompileRequest make_compile_request(const SpecialisationSpec& spec) {
  const auto op = parse_op(spec.op);
  if (!op) {
    throw ArgumentError("compile", "op", "a kiln op", "'" + std::string(spec.op) + "'");
  }
  const auto dtype = parse_dtype(spec.dtype);
  if (!dtype) {
    throw ArgumentError("compile", "dtype", "fp32, fp16 or bf16",
                        "'" + std::string(spec.dtype) + "'");
  }
  if (spec.sm < 75) {
    throw ArgumentError("compile", "arch", "sm_75 or newer", "sm_" + std::to_string(spec.sm));
  }
  CompileRequest request;
  request.family = &family(*op);
  request.problem.op = *op;
  request.problem.dtype = *dtype;
  request.problem.hidden = spec.hidden;
  request.problem.flags =
      spec.flags.value_or(*op == Op::rms_norm && spec.weight ? kRmsNormHasWeight : 0u);
  request.problem.aux = spec.aux;
  request.problem.align = spec.align;
  request.sm = spec.sm;
  request.format = spec.format;
  request.family->check(request.problem);
  if (spec.rows && *spec.rows < 1) {
    throw ArgumentError("compile", "rows", "at least 1", std::to_string(*spec.rows));
  }
  if (spec.rows && spec.config) {
    throw ArgumentError("compile", "rows", "no row count with a config (rows pick a heuristic)",
                        std::to_string(*spec.rows));
  }
  const DeviceTraits traits = spec.traits.value_or(DeviceTraits::for_arch(spec.sm));
  if (spec.config) {
    const std::string why = request.family->invalid_reason(request.problem, *spec.config, traits);
    if (!why.empty()) {
      throw ArgumentError("compile", "config", "a valid config", why);
    }
    request.config = *spec.config;
  } else {
    request.config = spec.rows ? request.family->heuristic_for_rows(
                                     request.problem, traits,
                                     row_bucket(*request.family, request.problem, *spec.rows))
                               : request.family->heuristic(request.problem, traits);
  }
  return request;
}

}  // namespace kiln::jit

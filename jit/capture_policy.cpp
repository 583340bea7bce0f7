#include "jit/capture_policy.h"

namespace kiln::jit {

std::string_view capture_mode_name(CaptureMode mode) {
  return mode == CaptureMode::error ? "error" : "heuristic";
}

std::optional<CaptureMode> parse_capture_mode(std::string_view text) {
  if (text == "heuristic") return CaptureMode::heuristic;
  if (text == "error") return CaptureMode::error;
  return std::nullopt;
}

std::string capture_miss_message(const Problem& problem, std::int64_t bucket, int device,
                                 std::string_view missing) {
  const std::string op(op_name(problem.op));
  return "kiln." + op + ": a CUDA graph is being captured and the kernel for " + problem.key() +
         " (rows<=" + std::to_string(bucket) + ", device " + std::to_string(device) + ") " +
         std::string(missing) +
         "; kiln never compiles or tunes inside a capture. Run the model once before capturing "
         "(kiln.warmup(model, *inputs), with batch_sizes= for the batch sizes you will capture), "
         "or fill the cache ahead with `kiln prewarm`";
}

}  // namespace kiln::jit

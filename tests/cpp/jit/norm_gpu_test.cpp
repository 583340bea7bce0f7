// Every sampled config of the norm ops (one-pass and persistent with prefetch) runs and agrees
// with the heuristic config's output on the GPU. The heuristic itself is checked against fp64
// math by the Python tests.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "cache/binary_store.h"
#include "cache/error.h"
#include "jit/device_probe.h"
#include "jit/driver.h"
#include "jit/evaluator.h"
#include "jit_test_support.h"
#include "templates/norm_family.h"

namespace kiln::jit {
namespace {

bool have_gpu() {
  try {
    return device_count() > 0;
  } catch (const Error& error) {
    MESSAGE("skipped, no GPU: " << error.message());
    return false;
  }
}

// The widest vector's configs with CTAs of max(128, threads_per_row), one-pass and
// persistent: every split of the row, without compiling the whole space.
std::vector<Config> sample(const Family& fam, const Problem& problem, const DeviceTraits& traits) {
  const std::vector<Config> space = fam.space(problem, traits);
  std::vector<Config> picked;
  for (const Config& config : space) {
    if (config.vec_bytes == space.front().vec_bytes &&
        config.cta_threads == std::max(128, config.threads_per_row)) {
      picked.push_back(config);
    }
  }
  return picked;
}

}  // namespace

TEST_CASE("GPU: sampled configs of every norm op agree with the heuristic") {
  if (!have_gpu()) return;
  test::ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const DeviceInfo info = probe_device(0);
  EvaluatorOptions quick;
  quick.min_repetitions = 3;
  quick.budget_ms = 1;
  quick.verify_elements = std::numeric_limits<std::int64_t>::max();  // check every row
  GpuEvaluator evaluator(info, &store, quick);
  const std::vector<Problem> problems = {
      {Op::fused_add_rms_norm, DType::bf16, 4096, kNormWeight, 16},
      {Op::fused_add_rms_norm, DType::f32, 4545, kNormWeight | kNormInPlace, 4},
      {Op::layer_norm, DType::f16, 3072, kNormWeight | kNormBias, 16},
      {Op::layer_norm, DType::bf16, 2431, 0u, 2},
      {Op::adaln, DType::bf16, 2048, kNormTable | kNormPerToken, 16},
      {Op::adaln, DType::f32, 3072, kNormLayer, 16},
      {Op::gated_adaln, DType::bf16, 2048, kNormTable | kNormPerToken, 16},
      {Op::gated_adaln, DType::f16, 1536, kNormLayer | kNormWeight, 16},
      {Op::rms_norm_gated, DType::bf16, 128, kNormWeight, 16},
      {Op::rms_norm_gated, DType::f16, 4545, kNormGateSigmoid, 2},
      {Op::rms_norm_gated, DType::bf16, 4096, kNormWeight | kNormGateFirst, 16},
  };
  for (const Problem& problem : problems) {
    CAPTURE(problem.key());
    const Family& fam = family(problem.op);
    const std::vector<Config> configs = sample(fam, problem, info.traits());
    REQUIRE(!configs.empty());
    // 1031 rows: not a multiple of any rows-per-CTA, and several rows per persistent CTA.
    const std::vector<Trial> trials =
        evaluator.evaluate(fam, problem, 1031, fam.heuristic(problem, info.traits()), configs);
    int ok = 0;
    for (const Trial& trial : trials) {
      CAPTURE(trial.config.key());
      CHECK_MESSAGE(trial.status == TrialStatus::ok, trial_status_name(trial.status)
                                                         << ": " << trial.message);
      ok += trial.status == TrialStatus::ok ? 1 : 0;
    }
    MESSAGE(problem.key() << ": " << ok << " of " << trials.size() << " configs ok");
  }
}

}  // namespace kiln::jit

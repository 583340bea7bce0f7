// NVRTC compiles every norm op's kernel (heuristic, a persistent, a re-reading, a staged and
// a clustered config where the space has one) for each arch kiln targets, with no GPU: what CI
// checks for sm_75, sm_80 and sm_90.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "templates/norm_family.h"

namespace kiln::jit {

TEST_CASE("the norm ops compile for sm_75, sm_80 and sm_90") {
  std::vector<CompileRequest> requests;
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (const Problem& problem : std::vector<Problem>{
             {Op::fused_add_rms_norm, DType::bf16, 4096, kNormWeight | kNormInPlace, 16},
             {Op::layer_norm, DType::f16, 4545, kNormWeight | kNormBias, 2},
             {Op::adaln, DType::f32, 3072, kNormLayer | kNormTable, 16},
             {Op::gated_adaln, DType::bf16, 2048, kNormWeight | kNormTable | kNormPerToken, 16},
             {Op::gated_adaln, DType::bf16, 2048, kNormLayer | kNormTable | kNormPerToken, 16},
             {Op::rms_norm, DType::bf16, 8192, kNormWeight, 16},
             {Op::gated_adaln, DType::bf16, 14848, kNormLayer | kNormTable | kNormPerToken, 16},
         }) {
      const Family& fam = family(problem.op);
      requests.push_back({&fam, problem, fam.heuristic(problem, traits), sm, BinaryFormat::cubin});
      for (const char* extra : {"grid", "reread", "stage", "cluster"}) {
        for (const Config& config : fam.space(problem, traits)) {
          if (config.extra.count(extra) != 0) {
            requests.push_back({&fam, problem, config, sm, BinaryFormat::cubin});
            break;
          }
        }
      }
    }
  }
  std::vector<std::optional<Expected<CompiledKernel>>> results(requests.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < requests.size();)
      results[i].emplace(compile(requests[i], nullptr));
  };
  std::thread helper(work);
  work();
  helper.join();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(requests[i].problem.key());
    CAPTURE(requests[i].config.key());
    CAPTURE(requests[i].sm);
    REQUIRE(results[i].has_value());
    CHECK_MESSAGE(results[i]->ok(),
                  (results[i]->ok() ? std::string() : results[i]->error().message()));
    if (results[i]->ok()) CHECK(!results[i]->value().binary.empty());
  }
}

}  // namespace kiln::jit

// NVRTC compiles every norm op's kernel (heuristic, a persistent, a re-reading, a staged and
// a clustered config where the space has one) for each arch kiln targets, with no GPU: what CI
// checks for sm_75, sm_80 and sm_90.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "templates/norm_backward_family.h"
#include "templates/norm_family.h"

namespace kiln::jit {

namespace {

// Compiles every request on two threads; each must give a non-empty binary.
void compile_and_check(const std::vector<CompileRequest>& requests) {
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

}  // namespace

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
             // Wan's seams: fp32 table rows beside bf16 and fp16 rows, per sample and per token.
             {Op::adaln, DType::bf16, 5120, kNormLayer | kNormTable | kNormTableF32, 16},
             {Op::gated_adaln, DType::f16, 1536,
              kNormLayer | kNormTable | kNormTableF32 | kNormPerToken, 16},
             {Op::gated_adaln, DType::bf16, 4545, kNormLayer | kNormTable | kNormTableF32, 2},
             // Qwen3-Next's value heads; an odd width, sigmoid-gated; a clustered width.
             {Op::rms_norm_gated, DType::bf16, 128, kNormWeight, 16},
             {Op::rms_norm_gated, DType::f16, 4545, kNormGateSigmoid, 2},
             {Op::rms_norm_gated, DType::f32, 14848, kNormWeight, 16},
             {Op::rms_norm_gated, DType::bf16, 4096, kNormWeight | kNormGateFirst, 16},
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
  compile_and_check(requests);
}

// The norm backward with its parameter sums in shared memory (shared_sums=1, offered past 8192
// wide): each arch's first such config, with and without prefetch, of three ops and dtypes.
TEST_CASE("the norm backward's shared sums compile for sm_75, sm_80 and sm_90") {
  std::vector<CompileRequest> requests;
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (const Problem& problem : std::vector<Problem>{
             {Op::layer_norm_backward, DType::bf16, 14848, kNormWeight | kNormBias, 16},
             {Op::rms_norm_backward, DType::f32, 14848, kNormWeight, 16},
             {Op::adaln_backward, DType::f16, 9216, kNormLayer, 16},
         }) {
      const Family& fam = family(problem.op);
      for (const bool prefetch : {false, true}) {
        for (const Config& config : fam.space(problem, traits)) {
          if (config.extra.count("shared_sums") == 1 &&
              (config.extra.count("prefetch") == 1) == prefetch) {
            requests.push_back({&fam, problem, config, sm, BinaryFormat::cubin});
            break;
          }
        }
      }
    }
  }
  REQUIRE(requests.size() >= 8);
  compile_and_check(requests);
}

// The norm backward's partial sums (kiln::sum_partials): every config of a bf16, an fp16 and
// an fp32 problem on sm_90, the heuristic of four problems (one of them not whole 16-byte
// fp32 vectors) on each arch.
TEST_CASE("the partial sums compile for sm_75, sm_80 and sm_90") {
  std::vector<CompileRequest> requests;
  const Problem bf16{Op::layer_norm_backward, DType::bf16, 8192, kNormSumPartials, 16};
  const Problem f16{Op::rms_norm_backward, DType::f16, 768, kNormSumPartials, 16};
  const Problem f32{Op::rms_norm_backward, DType::f32, 1024, kNormSumPartials, 16};
  for (const Problem& problem : {bf16, f16, f32}) {
    const Family& fam = family(problem.op);
    for (const Config& config : fam.space(problem, DeviceTraits::for_arch(90))) {
      requests.push_back({&fam, problem, config, 90, BinaryFormat::cubin});
    }
  }
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (const Problem& problem : std::vector<Problem>{
             {Op::rms_norm_backward, DType::f16, 4098, kNormSumPartials, 16},
             {Op::adaln_backward, DType::bf16, 3072, kNormSumPartials, 16},
             {Op::layer_norm_backward, DType::f32, 768, kNormSumPartials, 16},
             bf16,
         }) {
      requests.push_back({&family(problem.op), problem,
                          family(problem.op).heuristic(problem, traits), sm, BinaryFormat::cubin});
    }
  }
  REQUIRE(requests.size() >= 20);
  compile_and_check(requests);
}

}  // namespace kiln::jit

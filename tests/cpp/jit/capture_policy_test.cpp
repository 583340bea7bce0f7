#include <doctest/doctest.h>

#include <filesystem>

#include "cache/binary_store.h"
#include "jit/capture_policy.h"
#include "jit/compiler.h"
#include "jit_test_support.h"
#include "templates/family.h"
#include "templates/rms_norm_family.h"

namespace kiln::jit {

using test::contains;
using test::ScratchDir;

namespace {

CompileRequest heuristic_request() {
  Problem problem;
  problem.op = Op::rms_norm;
  problem.dtype = DType::bf16;
  problem.hidden = 2048;
  problem.flags = kRmsNormHasWeight;
  problem.align = 16;
  const Family& fam = family(Op::rms_norm);
  return CompileRequest{&fam, problem, fam.heuristic(problem, DeviceTraits::for_arch(80)), 80,
                        BinaryFormat::cubin};
}

std::size_t entries(const std::filesystem::path& root) {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    count += entry.path().extension() == ".bin";
  }
  return count;
}

}  // namespace

TEST_CASE("KILN_CAPTURE values parse and print") {
  CHECK(parse_capture_mode("heuristic") == CaptureMode::heuristic);
  CHECK(parse_capture_mode("error") == CaptureMode::error);
  CHECK_FALSE(parse_capture_mode("compile").has_value());
  CHECK_FALSE(parse_capture_mode("").has_value());
  CHECK(capture_mode_name(CaptureMode::heuristic) == "heuristic");
  CHECK(capture_mode_name(CaptureMode::error) == "error");
}

TEST_CASE("the capture error names the op, the specialisation, the bucket and the fixes") {
  const Problem problem = heuristic_request().problem;
  const std::string message = capture_miss_message(problem, 64, 1, "is missing");
  CHECK(contains(message, "kiln.rms_norm: a CUDA graph is being captured"));
  CHECK(contains(message, problem.key()));
  CHECK(contains(message, "rows<=64, device 1) is missing"));
  CHECK(contains(message, "kiln.warmup(model, *inputs)"));
  CHECK(contains(message, "kiln prewarm"));
}

TEST_CASE("find_stored reads the binary store and never compiles") {
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const CompileRequest request = heuristic_request();
  CHECK_FALSE(find_stored(request, &store).has_value());
  CHECK_FALSE(find_stored(request, nullptr).has_value());
  CHECK(entries(dir.path()) == 0);  // the miss compiled nothing into the store

  const CompiledKernel compiled = compile(request, &store).value();
  const auto stored = find_stored(request, &store);
  REQUIRE(stored.has_value());
  CHECK(stored->from_cache);
  CHECK(stored->key == compiled.key);
  CHECK(stored->binary == compiled.binary);
  CHECK(stored->lowered_name == compiled.lowered_name);
}

}  // namespace kiln::jit

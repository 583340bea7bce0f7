#include <doctest/doctest.h>

#include <vector>

#include "cache/error.h"
#include "jit/target.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::contains;

TEST_CASE("a supported arch is compiled for as requested") {
  const std::vector<int> archs = {75, 80, 86, 89, 90, 100, 120};
  for (BinaryFormat format : {BinaryFormat::cubin, BinaryFormat::ptx}) {
    const CompileTarget target = choose_target(90, format, archs, "13.0");
    CHECK(target.arch == 90);
    CHECK(target.format == format);
    CHECK(target.note.empty());
  }
}

TEST_CASE("a GPU newer than NVRTC knows gets PTX for the newest arch not newer than it") {
  const std::vector<int> archs = {75, 80, 86, 89, 90, 100, 120};
  const CompileTarget newest = choose_target(130, BinaryFormat::cubin, archs, "13.0");
  CHECK(newest.arch == 120);
  CHECK(newest.format == BinaryFormat::ptx);
  CHECK(contains(newest.note, "sm_130"));
  CHECK(contains(newest.note, "compute_120"));
  CHECK(contains(newest.note, "NVRTC 13.0"));
  // A gap in the list: sm_87 is served by compute_86, never by the newer compute_89.
  const CompileTarget gap = choose_target(87, BinaryFormat::cubin, archs, "13.0");
  CHECK(gap.arch == 86);
  CHECK(gap.format == BinaryFormat::ptx);
}

TEST_CASE("a GPU older than NVRTC supports is an error naming both") {
  const std::vector<int> archs = {75, 80, 90};
  CHECK_THROWS_WITH_AS(choose_target(70, BinaryFormat::cubin, archs, "13.0"),
                       doctest::Contains("cannot target sm_70: it supports sm_75 to sm_90"), Error);
  CHECK_THROWS_AS(choose_target(90, BinaryFormat::cubin, std::vector<int>{}, "13.0"), Error);
}

TEST_CASE("compile options: C++17 and the arch, real for cubin and virtual for PTX") {
  CHECK(compile_options(80, BinaryFormat::cubin) ==
        std::vector<std::string>{"-std=c++17", "--gpu-architecture=sm_80"});
  CHECK(compile_options(90, BinaryFormat::ptx) ==
        std::vector<std::string>{"-std=c++17", "--gpu-architecture=compute_90"});
  CHECK(format_name(BinaryFormat::cubin) == "cubin");
  CHECK(format_name(BinaryFormat::ptx) == "ptx");
}

}  // namespace kiln::jit

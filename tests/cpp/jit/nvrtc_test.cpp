#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "jit/nvrtc.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::contains;

namespace {

constexpr EmbeddedSource kHeaders[] = {
    {"kiln_test/scale.cuh",
     "#pragma once\n"
     "namespace kiln_test {\n"
     "template <int N> __global__ void scale(float* data) {\n"
     "  data[threadIdx.x] *= N;\n"
     "}\n"
     "}\n"},
};

std::string text(const std::vector<char>& bytes) {
  return {bytes.begin(), bytes.end()};
}

}  // namespace

TEST_CASE("NVRTC stage: headers by name, name expressions lowered, PTX and cubin") {
  NvrtcProgram program("#include \"kiln_test/scale.cuh\"\n", "scale_test.cu", kHeaders);
  program.add_name_expression("kiln_test::scale<2>");
  program.add_name_expression("kiln_test::scale<3>");
  Expected<NvrtcOutput> out = program.compile({"-std=c++17", "--gpu-architecture=sm_80"}, true);
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().what()));
  REQUIRE(out->lowered_names.size() == 2);
  CHECK(out->lowered_names[0] != out->lowered_names[1]);
  CHECK(contains(out->lowered_names[0], "scale"));
  REQUIRE(out->cubin.size() > 4);
  CHECK(std::string(out->cubin.data(), 4) ==
        "\x7f"
        "ELF");
  CHECK(contains(text(out->cubin), out->lowered_names[1]));
}

TEST_CASE("NVRTC stage: a virtual arch gives PTX naming each instantiated kernel") {
  NvrtcProgram program("#include \"kiln_test/scale.cuh\"\n", "scale_ptx.cu", kHeaders);
  program.add_name_expression("kiln_test::scale<5>");
  Expected<NvrtcOutput> out =
      program.compile({"-std=c++17", "--gpu-architecture=compute_90"}, false);
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().what()));
  const std::string ptx = text(out->ptx);
  CHECK(contains(ptx, ".target sm_90"));
  CHECK(contains(ptx, ".entry " + out->lowered_names.at(0)));
  CHECK(out->cubin.empty());
  CHECK(ptx.back() != '\0');
}

TEST_CASE("NVRTC stage: a compile failure is an Error carrying NVRTC's full log") {
  NvrtcProgram program(
      "#include \"kiln_test/scale.cuh\"\n"
      "__global__ void broken(float* p) { p[0] = kiln_undefined_identifier; }\n"
      "__global__ void broken2(float* p) { p[0] = kiln_second_undefined; }\n",
      "broken.cu", kHeaders);
  Expected<NvrtcOutput> out = program.compile({"-std=c++17", "--gpu-architecture=sm_90"}, true);
  REQUIRE_FALSE(out.ok());
  const Error& error = out.error();
  CHECK(contains(error.message(), "broken.cu"));
  CHECK(contains(error.message(), "NVRTC_ERROR_COMPILATION"));
  CHECK(contains(error.message(), "--gpu-architecture=sm_90"));
  // Both errors: the whole log, not its first line.
  CHECK(contains(error.log(), "kiln_undefined_identifier"));
  CHECK(contains(error.log(), "kiln_second_undefined"));
  CHECK(contains(error.log(), "error"));
  CHECK(contains(error.what(), "kiln_second_undefined"));
}

TEST_CASE("NVRTC stage: an invalid option is reported, not crashed on") {
  NvrtcProgram program("#include \"kiln_test/scale.cuh\"\n", "options.cu", kHeaders);
  Expected<NvrtcOutput> out = program.compile({"--no-such-nvrtc-option"}, false);
  REQUIRE_FALSE(out.ok());
  CHECK(contains(out.error().message(), "--no-such-nvrtc-option"));
}

}  // namespace kiln::jit

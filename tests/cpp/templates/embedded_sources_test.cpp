#include <doctest/doctest.h>

#include <set>
#include <string>

#include "templates/family.h"

namespace {

std::string_view text_of(std::string_view name) {
  for (const auto& source : kiln::embedded_sources()) {
    if (source.name == name) return source.text;
  }
  return {};
}

}  // namespace

TEST_CASE("the kernel templates are embedded under their include names") {
  std::set<std::string_view> names;
  for (const auto& source : kiln::embedded_sources()) names.insert(source.name);
  CHECK(names.count("kiln/common.cuh") == 1);
  CHECK(names.count("kiln/norm.cuh") == 1);
  CHECK(names.count("kiln/norm_params.cuh") == 1);
  for (const kiln::Family* family : kiln::families()) {
    CAPTURE(family->name());
    CHECK(names.count(family->header()) == 1);
  }
}

TEST_CASE("embedded templates use no toolkit header") {
  for (const auto& source : kiln::embedded_sources()) {
    CAPTURE(source.name);
    CHECK_FALSE(source.text.empty());
    CHECK(source.text.find("#include <") == std::string_view::npos);
  }
}

TEST_CASE("the norm template includes what it uses by its embedded names") {
  const std::string_view kernel = text_of("kiln/norm.cuh");
  CHECK(kernel.find("#include \"kiln/common.cuh\"") != std::string_view::npos);
  CHECK(kernel.find("#include \"kiln/norm_params.cuh\"") != std::string_view::npos);
  CHECK(kernel.find("norm(const NormArgs<FEATURES> p)") != std::string_view::npos);
  // The parameter header is shared with host code, so it must stay free of device code: it
  // includes the plain divisor only.
  const std::string_view params = text_of("kiln/norm_params.cuh");
  CHECK(params.find("struct NormParams") != std::string_view::npos);
  CHECK(params.find("__device__") == std::string_view::npos);
  const std::string_view divisor_include = "#include \"kiln/divisor.cuh\"";
  const auto include = params.find("#include");
  CHECK(params.substr(include, divisor_include.size()) == divisor_include);
  CHECK(params.find("#include", include + 1) == std::string_view::npos);
}

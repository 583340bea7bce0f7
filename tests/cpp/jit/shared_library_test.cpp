#include <dlfcn.h>
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "cache/error.h"
#include "jit/driver.h"
#include "jit/nvrtc.h"
#include "jit/shared_library.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::contains;
using test::EnvOverride;
using test::ScratchDir;

namespace {

LibrarySpec probe_spec(const std::string& file_name) {
  return LibrarySpec{
      .description = file_name,
      .env_var = "KILN_TEST_PROBE_LIB",
      .file_names = {file_name},
      .search_toolkit_and_wheels = true,
      .failure_prefix = "could not load the probe library",
      .hint = "set KILN_TEST_PROBE_LIB",
  };
}

std::string message_of(const LibrarySpec& spec) {
  try {
    load_library(spec);
  } catch (const Error& error) {
    return error.what();
  }
  return "(loaded)";
}

}  // namespace

TEST_CASE("an explicit library path that does not exist names the variable and the path") {
  EnvOverride env("KILN_TEST_PROBE_LIB", "/nonexistent/kiln/libprobe.so");
  const std::string message = message_of(probe_spec("libkiln_probe_absent.so"));
  CHECK(contains(message, "KILN_TEST_PROBE_LIB=/nonexistent/kiln/libprobe.so"));
  CHECK(contains(message, "not found"));
  CHECK(contains(message, "could not load the probe library"));
}

TEST_CASE("an explicit path is the only one tried, even when the library exists elsewhere") {
  EnvOverride env("KILN_NVRTC", "/nonexistent/libnvrtc.so.13");
  const std::string message = message_of(nvrtc_library_spec());
  CHECK(contains(message, "KILN_NVRTC=/nonexistent/libnvrtc.so.13"));
  CHECK_FALSE(contains(message, "/usr/local/cuda/lib64"));
}

TEST_CASE("a missing library lists every place tried and what to do") {
  EnvOverride env("KILN_TEST_PROBE_LIB", std::nullopt);
  EnvOverride cuda_home("CUDA_HOME", "/nonexistent/cuda-home");
  const std::string message = message_of(probe_spec("libkiln_probe_absent.so"));
  CHECK(contains(message, "KILN_TEST_PROBE_LIB unset"));
  CHECK(contains(message, "libkiln_probe_absent.so ("));  // the soname, with dlerror's text
  CHECK(contains(message, "/nonexistent/cuda-home/lib64/libkiln_probe_absent.so (not found)"));
  CHECK(contains(message, "/usr/local/cuda/lib64/libkiln_probe_absent.so (not found)"));
  CHECK(contains(message, "set KILN_TEST_PROBE_LIB"));
}

TEST_CASE("a folder added at run time is searched") {
  EnvOverride env("KILN_TEST_PROBE_LIB", std::nullopt);
  ScratchDir dir;
  // Any loadable library will do as the probe: the one that exports dlopen.
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&::dlopen), &info) != 0);
  const std::filesystem::path libdl = std::filesystem::canonical(info.dli_fname);
  const std::string name = "libkiln_probe_" + dir.path().filename().string() + ".so";
  std::filesystem::create_symlink(libdl, dir.path() / name);

  CHECK(contains(message_of(probe_spec(name)), "could not load the probe library"));
  add_library_search_dir(dir.path().string());
  const SharedLibrary library = load_library(probe_spec(name));
  CHECK(library.path() == dir.path() / name);
  CHECK(library.symbol("dlopen") != nullptr);
  CHECK(library.symbol("kiln_no_such_symbol") == nullptr);
  const auto dirs = library_search_dirs();
  CHECK(std::find(dirs.begin(), dirs.end(), dir.path()) != dirs.end());
}

TEST_CASE("NVRTC is found on this machine and reports its version and archs") {
  const Nvrtc& api = nvrtc();
  CHECK(api.major >= 12);
  CHECK(api.version_string() == std::to_string(api.major) + "." + std::to_string(api.minor));
  REQUIRE_FALSE(api.archs.empty());
  CHECK(std::is_sorted(api.archs.begin(), api.archs.end()));
  for (int sm : {75, 80, 90}) {
    CAPTURE(sm);
    CHECK(std::find(api.archs.begin(), api.archs.end(), sm) != api.archs.end());
  }
  CHECK(&nvrtc() == &api);  // loaded once
}

TEST_CASE("with no CUDA driver, driver() says no driver was found and where it looked") {
  if (void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(handle);
    MESSAGE("skipped: this machine has a libcuda.so.1 (a driver or a stub)");
    return;
  }
  EnvOverride env("KILN_LIBCUDA", std::nullopt);
  std::string message;
  try {
    driver();
  } catch (const Error& error) {
    message = error.what();
  }
  CHECK(contains(message, "no CUDA driver found"));
  CHECK(contains(message, "libcuda.so.1 ("));
  CHECK(contains(message, "KILN_LIBCUDA"));
  // A second attempt fails the same way (nothing half-initialised is kept).
  CHECK_THROWS_WITH_AS(driver(), doctest::Contains("no CUDA driver found"), Error);
}

TEST_CASE("KILN_LIBCUDA pointing nowhere is an error naming it") {
  EnvOverride env("KILN_LIBCUDA", "/nonexistent/libcuda.so.1");
  if (void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
    dlclose(handle);
    MESSAGE("skipped: the driver is already loaded in this process");
    return;
  }
  CHECK_THROWS_WITH_AS(driver(), doctest::Contains("KILN_LIBCUDA=/nonexistent/libcuda.so.1"),
                       Error);
}

}  // namespace kiln::jit

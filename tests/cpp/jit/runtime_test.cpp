#include <dlfcn.h>
#include <doctest/doctest.h>

#include "cache/error.h"
#include "jit/runtime.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::EnvOverride;

TEST_CASE("settings come from KILN_CACHE_DIR, KILN_CACHE and KILN_TUNE") {
  EnvOverride dir("KILN_CACHE_DIR", "/tmp/kiln-settings-test");
  EnvOverride cache("KILN_CACHE", "ro");
  {
    EnvOverride tune("KILN_TUNE", "full");
    const Settings settings = Settings::from_env();
    CHECK(settings.cache_dir == "/tmp/kiln-settings-test");
    CHECK(settings.cache_mode == CacheMode::ro);
    CHECK(settings.tune_mode == TuneMode::full);
  }
  {
    EnvOverride tune("KILN_TUNE", std::nullopt);
    CHECK(Settings::from_env().tune_mode == TuneMode::fast);
  }
  {
    EnvOverride tune("KILN_TUNE", "");
    CHECK(Settings::from_env().tune_mode == TuneMode::fast);
  }
  {
    EnvOverride tune("KILN_TUNE", "turbo");
    CHECK_THROWS_WITH_AS(Settings::from_env(), doctest::Contains("KILN_TUNE"), Error);
    CHECK_THROWS_WITH_AS(Settings::from_env(), doctest::Contains("'turbo'"), Error);
  }
}

TEST_CASE("KILN_PDL turns programmatic launches on (the default) or off") {
  {
    EnvOverride pdl("KILN_PDL", std::nullopt);
    CHECK(Settings::from_env().programmatic_launch);
  }
  {
    EnvOverride pdl("KILN_PDL", "off");
    CHECK_FALSE(Settings::from_env().programmatic_launch);
  }
  {
    EnvOverride pdl("KILN_PDL", "on");
    CHECK(Settings::from_env().programmatic_launch);
  }
  {
    EnvOverride pdl("KILN_PDL", "1");
    CHECK_THROWS_WITH_AS(Settings::from_env(),
                         doctest::Contains("KILN_PDL: expected one of on, off, got '1'"), Error);
  }
}

TEST_CASE("programmatic launches need sm_90 and a driver for CUDA 12.3") {
  DeviceInfo device;
  device.cc_major = 9;
  device.driver_version = 13000;
  CHECK(supports_programmatic_launch(device));
  device.driver_version = 12020;
  CHECK_FALSE(supports_programmatic_launch(device));
  device.driver_version = 12030;
  device.cc_major = 8;
  device.cc_minor = 9;
  CHECK_FALSE(supports_programmatic_launch(device));
}

TEST_CASE("the runtime exists without a GPU and touches no driver until asked") {
  // Other cases of this suite may have loaded a driver already; then there is nothing to see.
  const auto driver_loaded = [] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle) {
      dlclose(handle);
    }
    return handle != nullptr;
  };
  const bool loaded_before = driver_loaded();
  Runtime& runtime = Runtime::get();
  CHECK(&Runtime::get() == &runtime);

  Settings settings;
  settings.cache_dir = "/tmp/kiln-runtime-test";
  settings.cache_mode = CacheMode::off;
  settings.tune_mode = TuneMode::off;
  runtime.set_settings(settings);
  CHECK(runtime.settings().cache_dir == settings.cache_dir);
  CHECK(runtime.settings().cache_mode == CacheMode::off);
  CHECK(runtime.settings().tune_mode == TuneMode::off);
  const RuntimeStats stats = runtime.stats();
  runtime.forget_kernels();
  CHECK(runtime.stats().resolves == stats.resolves);
  if (!loaded_before) {
    CHECK_FALSE(driver_loaded());
  }
}

TEST_CASE("with no driver, asking the runtime for devices or kernels is a clear error") {
  if (void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(handle);
    MESSAGE("skipped: this machine has a CUDA driver");
    return;
  }
  Runtime& runtime = Runtime::get();
  CHECK_THROWS_WITH_AS(runtime.device_count(), doctest::Contains("no CUDA driver found"), Error);
  Problem problem;
  problem.dtype = DType::bf16;
  problem.hidden = 4096;
  problem.flags = 1;
  CHECK_THROWS_WITH_AS(runtime.kernel(0, problem, 16, nullptr),
                       doctest::Contains("no CUDA driver found"), Error);
  CHECK(runtime.stats().hot_hits == 0);
}

}  // namespace kiln::jit

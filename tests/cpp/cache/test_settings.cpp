#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "cache/error.h"
#include "cache/settings.h"

namespace {

// Sets or clears an environment variable for one scope, then puts back what was there.
class EnvOverride {
 public:
  EnvOverride(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvOverride() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

}  // namespace

TEST_CASE("cache modes print and parse") {
  using kiln::CacheMode;
  CHECK(kiln::cache_mode_name(CacheMode::rw) == "rw");
  CHECK(kiln::cache_mode_name(CacheMode::ro) == "ro");
  CHECK(kiln::cache_mode_name(CacheMode::off) == "off");
  CHECK(kiln::cache_mode_name(CacheMode::strict) == "strict");
  for (auto mode : {CacheMode::rw, CacheMode::ro, CacheMode::off, CacheMode::strict}) {
    CHECK(kiln::parse_cache_mode(kiln::cache_mode_name(mode)) == mode);
  }
  CHECK_FALSE(kiln::parse_cache_mode("").has_value());
  CHECK_FALSE(kiln::parse_cache_mode("readonly").has_value());
  CHECK_FALSE(kiln::parse_cache_mode("rw ").has_value());
}

TEST_CASE("default_cache_dir follows KILN_CACHE_DIR, XDG_CACHE_HOME, HOME") {
  EnvOverride home("HOME", "/home/someone");
  {
    EnvOverride dir("KILN_CACHE_DIR", "/srv/kiln-cache");
    EnvOverride xdg("XDG_CACHE_HOME", "/xdg/cache");
    CHECK(kiln::default_cache_dir() == std::filesystem::path("/srv/kiln-cache"));
  }
  {
    EnvOverride dir("KILN_CACHE_DIR", nullptr);
    EnvOverride xdg("XDG_CACHE_HOME", "/xdg/cache");
    CHECK(kiln::default_cache_dir() == std::filesystem::path("/xdg/cache/kiln"));
  }
  {
    EnvOverride dir("KILN_CACHE_DIR", "");
    EnvOverride xdg("XDG_CACHE_HOME", nullptr);
    CHECK(kiln::default_cache_dir() == std::filesystem::path("/home/someone/.cache/kiln"));
  }
  {
    // The XDG spec says a relative XDG_CACHE_HOME is to be ignored.
    EnvOverride dir("KILN_CACHE_DIR", nullptr);
    EnvOverride xdg("XDG_CACHE_HOME", "relative/cache");
    CHECK(kiln::default_cache_dir() == std::filesystem::path("/home/someone/.cache/kiln"));
  }
}

TEST_CASE("default_cache_dir without any variable is .kiln-cache in the working folder") {
  EnvOverride dir("KILN_CACHE_DIR", nullptr);
  EnvOverride xdg("XDG_CACHE_HOME", nullptr);
  EnvOverride home("HOME", nullptr);
  auto path = kiln::default_cache_dir();
  CHECK(path.filename() == ".kiln-cache");
  CHECK(path.parent_path() == std::filesystem::current_path());
}

TEST_CASE("default_cache_mode reads KILN_CACHE") {
  {
    EnvOverride mode("KILN_CACHE", nullptr);
    CHECK(kiln::default_cache_mode() == kiln::CacheMode::rw);
  }
  {
    EnvOverride mode("KILN_CACHE", "strict");
    CHECK(kiln::default_cache_mode() == kiln::CacheMode::strict);
  }
  {
    EnvOverride mode("KILN_CACHE", "ro");
    CHECK(kiln::default_cache_mode() == kiln::CacheMode::ro);
  }
}

TEST_CASE("an unknown KILN_CACHE is an error naming the variable, the choices and the value") {
  EnvOverride mode("KILN_CACHE", "readonly");
  std::string message;
  try {
    kiln::default_cache_mode();
  } catch (const kiln::Error& error) {
    message = error.what();
  }
  REQUIRE_FALSE(message.empty());
  CHECK(message.find("KILN_CACHE") != std::string::npos);
  CHECK(message.find("readonly") != std::string::npos);
  for (const char* allowed : {"rw", "ro", "off", "strict"}) {
    CHECK(message.find(allowed) != std::string::npos);
  }
}

#include "jit/shared_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <system_error>

#include "cache/error.h"

namespace kiln::jit {
namespace fs = std::filesystem;

namespace {

std::mutex& extra_dirs_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<fs::path>& extra_dirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::string last_dlerror() {
  const char* text = dlerror();
  return text ? std::string(text) : std::string("unknown dlopen error");
}

// The file this code was linked into: the Python extension (site-packages/kiln/_C*.so) or
// the kiln executable, so the wheels installed beside it can be found without configuration.
fs::path own_binary_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_binary_dir), &info) == 0 || !info.dli_fname) return {};
  std::error_code ec;
  fs::path path = fs::canonical(info.dli_fname, ec);
  if (ec) path = info.dli_fname;
  return path.parent_path();
}

bool path_exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// <prefix>/lib/python3*/site-packages/nvidia/*/lib for an executable in <prefix>/bin: the
// layout of a virtual environment or a conda prefix.
void add_prefix_wheels(const fs::path& prefix, std::vector<fs::path>& out) {
  std::error_code ec;
  const fs::path lib = prefix / "lib";
  if (!fs::is_directory(lib, ec)) return;
  std::vector<fs::path> found;
  for (const auto& python : fs::directory_iterator(lib, ec)) {
    if (python.path().filename().string().rfind("python3", 0) != 0) continue;
    const fs::path nvidia = python.path() / "site-packages" / "nvidia";
    if (!fs::is_directory(nvidia, ec)) continue;
    for (const auto& wheel : fs::directory_iterator(nvidia, ec)) {
      if (fs::is_directory(wheel.path() / "lib", ec)) found.push_back(wheel.path() / "lib");
    }
  }
  // Directory order is arbitrary; sort so the search (and its message) is reproducible.
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
}

}  // namespace

void* SharedLibrary::symbol(const char* name) const {
  return dlsym(handle_, name);
}

void add_library_search_dir(std::string dir) {
  std::lock_guard lock(extra_dirs_mutex());
  fs::path path(std::move(dir));
  auto& dirs = extra_dirs();
  if (std::find(dirs.begin(), dirs.end(), path) == dirs.end()) dirs.push_back(std::move(path));
}

std::vector<fs::path> library_search_dirs() {
  std::vector<fs::path> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const std::string root = env(var);
    if (!root.empty()) dirs.push_back(fs::path(root) / "lib64");
  }
  dirs.emplace_back("/usr/local/cuda/lib64");
  {
    std::lock_guard lock(extra_dirs_mutex());
    dirs.insert(dirs.end(), extra_dirs().begin(), extra_dirs().end());
  }
  const fs::path own = own_binary_dir();
  if (!own.empty()) {
    for (const char* wheel : {"cu13", "cu12", "cuda_nvrtc"}) {
      dirs.push_back(own.parent_path() / "nvidia" / wheel / "lib");
    }
    add_prefix_wheels(own.parent_path(), dirs);
  }
  std::vector<fs::path> unique;
  for (auto& dir : dirs) {
    if (std::find(unique.begin(), unique.end(), dir) == unique.end()) unique.push_back(dir);
  }
  return unique;
}

SharedLibrary load_library(const LibrarySpec& spec) {
  const std::string explicit_path = env(spec.env_var.c_str());
  if (!explicit_path.empty()) {
    if (void* handle = dlopen(explicit_path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return SharedLibrary(handle, explicit_path);
    }
    const std::string why = path_exists(explicit_path) ? last_dlerror() : std::string("not found");
    throw Error("kiln: " + spec.failure_prefix + ": " + spec.env_var + "=" + explicit_path + " (" +
                why + "); fix or unset " + spec.env_var);
  }

  std::string tried = spec.env_var + " unset";
  for (const auto& name : spec.file_names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return SharedLibrary(handle, name);
    }
    tried += ", " + name + " (" + last_dlerror() + ")";
  }
  if (spec.search_toolkit_and_wheels) {
    for (const auto& dir : library_search_dirs()) {
      for (const auto& name : spec.file_names) {
        const fs::path path = dir / name;
        if (!path_exists(path)) {
          tried += ", " + path.string() + " (not found)";
          continue;
        }
        if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
          return SharedLibrary(handle, path);
        }
        tried += ", " + path.string() + " (" + last_dlerror() + ")";
      }
    }
  }
  throw Error("kiln: " + spec.failure_prefix + " (" + spec.description + "): tried " + tried +
              "; " + spec.hint);
}

const LibrarySpec& driver_library_spec() {
  static const LibrarySpec spec{
      .description = "libcuda.so.1",
      .env_var = "KILN_LIBCUDA",
      .file_names = {"libcuda.so.1", "libcuda.so"},
      .search_toolkit_and_wheels = false,
      .failure_prefix = "no CUDA driver found",
      .hint = "install the NVIDIA driver, or set KILN_LIBCUDA to its libcuda.so.1",
  };
  return spec;
}

const LibrarySpec& nvrtc_library_spec() {
  static const LibrarySpec spec{
      .description = "libnvrtc.so.*",
      .env_var = "KILN_NVRTC",
      .file_names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
      .search_toolkit_and_wheels = true,
      .failure_prefix = "could not load NVRTC",
      .hint = "install the CUDA toolkit or torch, or set KILN_NVRTC",
  };
  return spec;
}

}  // namespace kiln::jit

// Finding and opening the CUDA driver and NVRTC at run time. The search order, for a library:
//   1. its explicit variable (KILN_LIBCUDA, KILN_NVRTC): when set, only that path is tried;
//   2. the system sonames (what the dynamic loader finds: ldconfig, LD_LIBRARY_PATH);
//   3. the toolkit folders $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64
//      (NVRTC only: the driver never lives there, only its link stub);
//   4. the NVIDIA wheels a pip-installed torch brings (NVRTC only): folders added with
//      add_library_search_dir(), then the wheels next to kiln's own binary.
// A failure lists every place tried and what went wrong there.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::jit {

struct LibrarySpec {
  std::string description;                 // "NVRTC (libnvrtc.so.*)", in messages
  std::string env_var;                     // "KILN_NVRTC"
  std::vector<std::string> file_names;     // sonames, most preferred first
  bool search_toolkit_and_wheels = false;  // steps 3 and 4
  std::string failure_prefix;              // "could not load NVRTC"
  std::string hint;                        // what to do about it
};

// An opened library. Never closed: unloading the driver or NVRTC while the process still
// holds modules or programs (or at exit, in an unknown order) is a known source of crashes.
class SharedLibrary {
 public:
  SharedLibrary(void* handle, std::filesystem::path path)
      : handle_(handle), path_(std::move(path)) {}
  // The symbol's address, or nullptr when the library does not export it.
  void* symbol(const char* name) const;
  // The path that was opened (a soname when the dynamic loader found it).
  const std::filesystem::path& path() const { return path_; }

 private:
  void* handle_;
  std::filesystem::path path_;
};

// Opens the library or throws kiln::Error listing every path tried.
SharedLibrary load_library(const LibrarySpec& spec);

// Adds a folder to search in step 4 (ahead of the automatic ones). The Python package calls
// it with torch's NVIDIA wheel folders (site-packages/nvidia/cu13/lib, .../cuda_nvrtc/lib).
// Takes effect on the next load attempt; a library already loaded stays loaded.
void add_library_search_dir(std::string dir);

// The folders of steps 3 and 4, in order, existing or not (for messages and `kiln devices`).
std::vector<std::filesystem::path> library_search_dirs();

// The two libraries kiln uses.
const LibrarySpec& driver_library_spec();
const LibrarySpec& nvrtc_library_spec();

}  // namespace kiln::jit

// NVRTC, loaded at run time, and a staged compile in the spirit of jitify2: a program is
// created from a source and the embedded headers, given name expressions, compiled with
// options; the result carries the binary, the lowered names and the log, or an Error that
// carries NVRTC's full log. Programs are always destroyed, on every path.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/expected.h"
#include "jit/cuda_api.h"
#include "templates/family.h"

namespace kiln::jit {

struct Nvrtc {
  std::string path;  // the libnvrtc that was opened
  int major = 0, minor = 0;
  std::vector<int> archs;  // supported sm_XX / compute_XX targets, ascending (75, 80, ...)

  PFN_nvrtcGetErrorString nvrtcGetErrorString = nullptr;
  PFN_nvrtcVersion nvrtcVersion = nullptr;
  PFN_nvrtcGetNumSupportedArchs nvrtcGetNumSupportedArchs = nullptr;
  PFN_nvrtcGetSupportedArchs nvrtcGetSupportedArchs = nullptr;
  PFN_nvrtcCreateProgram nvrtcCreateProgram = nullptr;
  PFN_nvrtcDestroyProgram nvrtcDestroyProgram = nullptr;
  PFN_nvrtcCompileProgram nvrtcCompileProgram = nullptr;
  PFN_nvrtcGetSize nvrtcGetPTXSize = nullptr;
  PFN_nvrtcGetBytes nvrtcGetPTX = nullptr;
  PFN_nvrtcGetSize nvrtcGetCUBINSize = nullptr;
  PFN_nvrtcGetBytes nvrtcGetCUBIN = nullptr;
  PFN_nvrtcGetSize nvrtcGetProgramLogSize = nullptr;
  PFN_nvrtcGetBytes nvrtcGetProgramLog = nullptr;
  PFN_nvrtcAddNameExpression nvrtcAddNameExpression = nullptr;
  PFN_nvrtcGetLoweredName nvrtcGetLoweredName = nullptr;

  // "13.0"
  std::string version_string() const;
};

// The process's NVRTC: opened on first use (thread-safe), kept for the process. Throws
// kiln::Error "kiln: could not load NVRTC (libnvrtc.so.*): tried ..." when it cannot be found.
// A failed attempt is retried on the next call.
const Nvrtc& nvrtc();

struct NvrtcOutput {
  std::string log;                         // warnings; empty when there were none
  std::vector<char> ptx;                   // PTX text (no trailing NUL)
  std::vector<char> cubin;                 // empty for a compute_XX (PTX) target
  std::vector<std::string> lowered_names;  // one per name expression, in the order added
};

class NvrtcProgram {
 public:
  // Headers are given to NVRTC by their names ("kiln/norm.cuh"), so `#include
  // "kiln/..."` resolves without any file system. Throws kiln::Error if NVRTC refuses.
  NvrtcProgram(std::string_view source, std::string_view name,
               std::span<const EmbeddedSource> headers);
  ~NvrtcProgram();
  NvrtcProgram(const NvrtcProgram&) = delete;
  NvrtcProgram& operator=(const NvrtcProgram&) = delete;

  // Asks NVRTC to instantiate `expression` (a template-id) and report its mangled name.
  void add_name_expression(const std::string& expression);

  // Compiles. On failure, an Error whose log() is NVRTC's full log. `want_cubin`: fetch the
  // cubin (only an sm_XX target has one).
  Expected<NvrtcOutput> compile(const std::vector<std::string>& options, bool want_cubin);

 private:
  const Nvrtc& api_;
  nvrtcProgram program_ = nullptr;
  std::string name_;
  std::vector<std::string> expressions_;
};

// "NVRTC_ERROR_COMPILATION" (NVRTC's own name for the result).
std::string nvrtc_result_name(nvrtcResult result);

}  // namespace kiln::jit

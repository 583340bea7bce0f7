#include "jit/nvrtc.h"

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>

#include "cache/error.h"
#include "jit/shared_library.h"

namespace kiln::jit {
namespace {

std::atomic<Nvrtc*> g_nvrtc{nullptr};
std::mutex g_nvrtc_mutex;

template <typename Fn>
void resolve(const SharedLibrary& library, Fn& slot, const char* name) {
  void* address = library.symbol(name);
  if (!address) {
    throw Error("kiln: NVRTC " + library.path().string() + " does not export " + name +
                "; NVRTC from CUDA 12.0 or newer is required");
  }
  slot = reinterpret_cast<Fn>(address);
}

std::string result_name(const Nvrtc& api, nvrtcResult result) {
  const char* name = api.nvrtcGetErrorString ? api.nvrtcGetErrorString(result) : nullptr;
  return name ? std::string(name) : "nvrtcResult " + std::to_string(result);
}

void check(const Nvrtc& api, nvrtcResult result, std::string_view call) {
  if (result == NVRTC_SUCCESS) return;
  throw Error("NVRTC: " + std::string(call) + " failed: " + result_name(api, result));
}

std::unique_ptr<Nvrtc> open_nvrtc() {
  const SharedLibrary library = load_library(nvrtc_library_spec());
  auto api = std::make_unique<Nvrtc>();
  api->path = library.path().string();
  resolve(library, api->nvrtcGetErrorString, "nvrtcGetErrorString");
  resolve(library, api->nvrtcVersion, "nvrtcVersion");
  resolve(library, api->nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
  resolve(library, api->nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs");
  resolve(library, api->nvrtcCreateProgram, "nvrtcCreateProgram");
  resolve(library, api->nvrtcDestroyProgram, "nvrtcDestroyProgram");
  resolve(library, api->nvrtcCompileProgram, "nvrtcCompileProgram");
  resolve(library, api->nvrtcGetPTXSize, "nvrtcGetPTXSize");
  resolve(library, api->nvrtcGetPTX, "nvrtcGetPTX");
  resolve(library, api->nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
  resolve(library, api->nvrtcGetCUBIN, "nvrtcGetCUBIN");
  resolve(library, api->nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
  resolve(library, api->nvrtcGetProgramLog, "nvrtcGetProgramLog");
  resolve(library, api->nvrtcAddNameExpression, "nvrtcAddNameExpression");
  resolve(library, api->nvrtcGetLoweredName, "nvrtcGetLoweredName");

  check(*api, api->nvrtcVersion(&api->major, &api->minor), "nvrtcVersion");
  int count = 0;
  check(*api, api->nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  api->archs.resize(static_cast<std::size_t>(std::max(count, 0)));
  if (count > 0)
    check(*api, api->nvrtcGetSupportedArchs(api->archs.data()), "nvrtcGetSupportedArchs");
  std::sort(api->archs.begin(), api->archs.end());
  return api;
}

// NVRTC's outputs are NUL-terminated strings (log, PTX) or raw bytes (cubin).
std::vector<char> fetch(const Nvrtc& api, nvrtcProgram program, PFN_nvrtcGetSize size_fn,
                        PFN_nvrtcGetBytes bytes_fn, std::string_view what, bool text) {
  std::size_t size = 0;
  check(api, size_fn(program, &size), std::string(what) + " size");
  std::vector<char> bytes(size);
  if (size > 0) check(api, bytes_fn(program, bytes.data()), what);
  if (text) {
    while (!bytes.empty() && bytes.back() == '\0') bytes.pop_back();
  }
  return bytes;
}

}  // namespace

std::string Nvrtc::version_string() const {
  return std::to_string(major) + "." + std::to_string(minor);
}

const Nvrtc& nvrtc() {
  if (Nvrtc* loaded = g_nvrtc.load(std::memory_order_acquire)) return *loaded;
  std::lock_guard lock(g_nvrtc_mutex);
  if (Nvrtc* loaded = g_nvrtc.load(std::memory_order_relaxed)) return *loaded;
  Nvrtc* opened = open_nvrtc().release();  // kept for the life of the process
  g_nvrtc.store(opened, std::memory_order_release);
  return *opened;
}

std::string nvrtc_result_name(nvrtcResult result) {
  const Nvrtc* api = g_nvrtc.load(std::memory_order_acquire);
  return api ? result_name(*api, result) : "nvrtcResult " + std::to_string(result);
}

NvrtcProgram::NvrtcProgram(std::string_view source, std::string_view name,
                           std::span<const EmbeddedSource> headers)
    : api_(nvrtc()), name_(name) {
  // NVRTC wants NUL-terminated strings; the embedded texts are views.
  std::vector<std::string> texts, names;
  texts.reserve(headers.size());
  names.reserve(headers.size());
  for (const auto& header : headers) {
    texts.emplace_back(header.text);
    names.emplace_back(header.name);
  }
  std::vector<const char*> text_ptrs, name_ptrs;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    text_ptrs.push_back(texts[i].c_str());
    name_ptrs.push_back(names[i].c_str());
  }
  const std::string source_text(source);
  const nvrtcResult result =
      api_.nvrtcCreateProgram(&program_, source_text.c_str(), name_.c_str(),
                              static_cast<int>(texts.size()), text_ptrs.data(), name_ptrs.data());
  if (result != NVRTC_SUCCESS) {
    program_ = nullptr;
    throw Error("NVRTC: nvrtcCreateProgram failed for " + name_ + ": " + nvrtc_result_name(result));
  }
}

NvrtcProgram::~NvrtcProgram() {
  if (program_) api_.nvrtcDestroyProgram(&program_);
}

void NvrtcProgram::add_name_expression(const std::string& expression) {
  const nvrtcResult result = api_.nvrtcAddNameExpression(program_, expression.c_str());
  if (result != NVRTC_SUCCESS) {
    throw Error("NVRTC: nvrtcAddNameExpression failed for " + expression + " in " + name_ + ": " +
                nvrtc_result_name(result));
  }
  expressions_.push_back(expression);
}

Expected<NvrtcOutput> NvrtcProgram::compile(const std::vector<std::string>& options,
                                            bool want_cubin) {
  try {
    std::vector<const char*> option_ptrs;
    for (const auto& option : options) option_ptrs.push_back(option.c_str());
    const nvrtcResult result = api_.nvrtcCompileProgram(
        program_, static_cast<int>(option_ptrs.size()), option_ptrs.data());
    const std::vector<char> log_bytes = fetch(api_, program_, api_.nvrtcGetProgramLogSize,
                                              api_.nvrtcGetProgramLog, "nvrtcGetProgramLog", true);
    std::string log(log_bytes.begin(), log_bytes.end());
    if (result != NVRTC_SUCCESS) {
      std::string joined;
      for (const auto& option : options) joined += (joined.empty() ? "" : " ") + option;
      return Error("NVRTC: compiling " + name_ + " failed (" + nvrtc_result_name(result) +
                       ") with options " + joined,
                   log.empty() ? std::string("(NVRTC gave no log)") : log);
    }
    NvrtcOutput out;
    out.log = std::move(log);
    out.ptx = fetch(api_, program_, api_.nvrtcGetPTXSize, api_.nvrtcGetPTX, "nvrtcGetPTX", true);
    if (want_cubin) {
      out.cubin =
          fetch(api_, program_, api_.nvrtcGetCUBINSize, api_.nvrtcGetCUBIN, "nvrtcGetCUBIN", false);
      if (out.cubin.empty()) {
        return Error("NVRTC: compiling " + name_ + " produced no cubin (is the target an sm_XX?)");
      }
    }
    for (const auto& expression : expressions_) {
      const char* lowered = nullptr;
      check(api_, api_.nvrtcGetLoweredName(program_, expression.c_str(), &lowered),
            "nvrtcGetLoweredName(" + expression + ")");
      if (!lowered || !*lowered) {
        return Error("NVRTC: no lowered name for " + expression + " in " + name_);
      }
      out.lowered_names.emplace_back(lowered);
    }
    return out;
  } catch (const Error& error) {
    return error;
  }
}

}  // namespace kiln::jit

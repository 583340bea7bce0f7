// kiln's own declarations of the parts of the CUDA driver API and NVRTC it calls. Both
// libraries are opened at run time with dlopen, so kiln builds on a machine with no CUDA
// toolkit and imports on one with no GPU. Numeric values are those of the toolkit's cuda.h
// and nvrtc.h (CUDA 12 and 13 agree on every value used here).
//
// The opaque handle structs are declared at global scope with the toolkit's own tags, so a
// handle from torch or cuda.h (cudaStream_t is CUstream_st*) is the same type as kiln's.
#pragma once

#include <cstddef>

struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct _nvrtcProgram;

namespace kiln::jit {

// ---- driver API: handles and plain types -------------------------------------------------

using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;

// A fixed underlying type, so a value this list does not name is still representable.
enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
  CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_UNKNOWN = 999,
};

enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
  CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

enum CUfunction_attribute : int {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
  CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
  CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

enum CUjit_option : int {
  CU_JIT_INFO_LOG_BUFFER = 3,
  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

enum CUstreamCaptureStatus : int {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
};

enum CUstreamCaptureMode : int {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};

// cuLaunchKernelEx's configuration, as cuda.h lays it out (only the attribute kiln sets is
// named; the value union is 64 bytes, 8-aligned).
enum CUlaunchAttributeID : int {
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

union CUlaunchAttributeValue {
  char pad[64];
  void* align;
  int programmatic_stream_serialization_allowed;
};

struct CUlaunchAttribute {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
};

struct CUlaunchConfig {
  unsigned int grid_x, grid_y, grid_z;
  unsigned int block_x, block_y, block_z;
  unsigned int shared_bytes;
  CUstream stream;
  CUlaunchAttribute* attributes;
  unsigned int attribute_count;
};

static_assert(sizeof(CUlaunchAttributeValue) == 64 && sizeof(CUlaunchAttribute) == 72 &&
                  sizeof(CUlaunchConfig) == 56,
              "cuLaunchKernelEx's structs as cuda.h lays them out");

inline constexpr unsigned int CU_STREAM_DEFAULT = 0x0;
inline constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned int CU_EVENT_DEFAULT = 0x0;

// ---- driver API: entry points (the signatures of the versioned symbols kiln resolves) ------

using PFN_cuInit = CUresult (*)(unsigned int flags);
using PFN_cuDriverGetVersion = CUresult (*)(int* version);
using PFN_cuGetErrorName = CUresult (*)(CUresult error, const char** text);
using PFN_cuGetErrorString = CUresult (*)(CUresult error, const char** text);

using PFN_cuDeviceGetCount = CUresult (*)(int* count);
using PFN_cuDeviceGet = CUresult (*)(CUdevice* device, int ordinal);
using PFN_cuDeviceGetName = CUresult (*)(char* name, int length, CUdevice device);
using PFN_cuDeviceGetAttribute = CUresult (*)(int* value, CUdevice_attribute attribute,
                                              CUdevice device);
using PFN_cuDeviceTotalMem = CUresult (*)(std::size_t* bytes, CUdevice device);

using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext* context, CUdevice device);
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext* context);
using PFN_cuCtxSetCurrent = CUresult (*)(CUcontext context);
using PFN_cuCtxPushCurrent = CUresult (*)(CUcontext context);
using PFN_cuCtxPopCurrent = CUresult (*)(CUcontext* context);

using PFN_cuModuleLoadDataEx = CUresult (*)(CUmodule* module, const void* image,
                                            unsigned int option_count, CUjit_option* options,
                                            void** option_values);
using PFN_cuModuleGetFunction = CUresult (*)(CUfunction* function, CUmodule module,
                                             const char* name);
using PFN_cuFuncGetAttribute = CUresult (*)(int* value, CUfunction_attribute attribute,
                                            CUfunction function);
using PFN_cuFuncSetAttribute = CUresult (*)(CUfunction function, CUfunction_attribute attribute,
                                            int value);
using PFN_cuLaunchKernel = CUresult (*)(CUfunction function, unsigned int grid_x,
                                        unsigned int grid_y, unsigned int grid_z,
                                        unsigned int block_x, unsigned int block_y,
                                        unsigned int block_z, unsigned int shared_bytes,
                                        CUstream stream, void** params, void** extra);

using PFN_cuLaunchKernelEx = CUresult (*)(const CUlaunchConfig* config, CUfunction function,
                                          void** params, void** extra);

using PFN_cuMemAlloc = CUresult (*)(CUdeviceptr* pointer, std::size_t bytes);
using PFN_cuMemFree = CUresult (*)(CUdeviceptr pointer);
using PFN_cuMemcpyHtoD = CUresult (*)(CUdeviceptr destination, const void* source,
                                      std::size_t bytes);
using PFN_cuMemcpyDtoH = CUresult (*)(void* destination, CUdeviceptr source, std::size_t bytes);
using PFN_cuMemcpyDtoDAsync = CUresult (*)(CUdeviceptr destination, CUdeviceptr source,
                                           std::size_t bytes, CUstream stream);
using PFN_cuMemsetD8 = CUresult (*)(CUdeviceptr destination, unsigned char value,
                                    std::size_t count);
using PFN_cuMemsetD8Async = CUresult (*)(CUdeviceptr destination, unsigned char value,
                                         std::size_t count, CUstream stream);

using PFN_cuStreamCreate = CUresult (*)(CUstream* stream, unsigned int flags);
using PFN_cuStreamDestroy = CUresult (*)(CUstream stream);
using PFN_cuStreamSynchronize = CUresult (*)(CUstream stream);
using PFN_cuStreamIsCapturing = CUresult (*)(CUstream stream, CUstreamCaptureStatus* status);
using PFN_cuThreadExchangeStreamCaptureMode = CUresult (*)(CUstreamCaptureMode* mode);

using PFN_cuEventCreate = CUresult (*)(CUevent* event, unsigned int flags);
using PFN_cuEventDestroy = CUresult (*)(CUevent event);
using PFN_cuEventRecord = CUresult (*)(CUevent event, CUstream stream);
using PFN_cuEventSynchronize = CUresult (*)(CUevent event);
using PFN_cuEventElapsedTime = CUresult (*)(float* milliseconds, CUevent start, CUevent end);

// ---- NVRTC --------------------------------------------------------------------------------

using nvrtcProgram = _nvrtcProgram*;

enum nvrtcResult : int {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
  NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
  NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
  NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
};

using PFN_nvrtcGetErrorString = const char* (*)(nvrtcResult result);
using PFN_nvrtcVersion = nvrtcResult (*)(int* major, int* minor);
using PFN_nvrtcGetNumSupportedArchs = nvrtcResult (*)(int* count);
using PFN_nvrtcGetSupportedArchs = nvrtcResult (*)(int* archs);
using PFN_nvrtcCreateProgram = nvrtcResult (*)(nvrtcProgram* program, const char* source,
                                               const char* name, int header_count,
                                               const char* const* headers,
                                               const char* const* include_names);
using PFN_nvrtcDestroyProgram = nvrtcResult (*)(nvrtcProgram* program);
using PFN_nvrtcCompileProgram = nvrtcResult (*)(nvrtcProgram program, int option_count,
                                                const char* const* options);
using PFN_nvrtcGetSize = nvrtcResult (*)(nvrtcProgram program, std::size_t* bytes);
using PFN_nvrtcGetBytes = nvrtcResult (*)(nvrtcProgram program, char* destination);
using PFN_nvrtcAddNameExpression = nvrtcResult (*)(nvrtcProgram program,
                                                   const char* name_expression);
using PFN_nvrtcGetLoweredName = nvrtcResult (*)(nvrtcProgram program, const char* name_expression,
                                                const char** lowered_name);

}  // namespace kiln::jit

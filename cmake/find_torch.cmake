# Locates the installed PyTorch for the op extension without find_package(Torch), which
# would demand a CUDA toolkit: kiln's extension links only libtorch's CPU-side libraries
# (CUDA is reached through the driver API at run time).
#
# The extension must be built against the torch it will run with. Under pip's build
# isolation torch is not importable from the build environment, so ask the interpreter in
# isolated mode (-I), which sees the target environment's site-packages.
set(_kiln_torch_query [=[
import os, torch
root = os.path.dirname(torch.__file__)
print(root)
print(torch.__version__)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
]=])
foreach(_kiln_flags "" "-I")
  execute_process(
    COMMAND ${Python_EXECUTABLE} ${_kiln_flags} -c "${_kiln_torch_query}"
    OUTPUT_VARIABLE _kiln_torch_out
    ERROR_VARIABLE _kiln_torch_err
    RESULT_VARIABLE _kiln_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_kiln_torch_rc EQUAL 0)
    break()
  endif()
endforeach()
if(NOT _kiln_torch_rc EQUAL 0)
  message(FATAL_ERROR "kiln: PyTorch is needed to build the op extension but `import torch` "
                      "failed with ${Python_EXECUTABLE}:\n${_kiln_torch_err}\n"
                      "Install torch first (pip install torch), then build with "
                      "`pip install --no-build-isolation .`, or pass -DKILN_BUILD_TORCH=OFF.")
endif()
string(REPLACE "\n" ";" _kiln_torch_lines "${_kiln_torch_out}")
list(GET _kiln_torch_lines 0 KILN_TORCH_ROOT)
list(GET _kiln_torch_lines 1 KILN_TORCH_VERSION)
list(GET _kiln_torch_lines 2 KILN_TORCH_CXX11_ABI)
message(STATUS "kiln: building the op extension against torch ${KILN_TORCH_VERSION} at ${KILN_TORCH_ROOT}")

add_library(kiln_torch INTERFACE)
target_include_directories(kiln_torch SYSTEM INTERFACE
  ${KILN_TORCH_ROOT}/include
  ${KILN_TORCH_ROOT}/include/torch/csrc/api/include)
target_compile_definitions(kiln_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${KILN_TORCH_CXX11_ABI} TORCH_API_INCLUDE_EXTENSION_H)
foreach(_lib c10 torch torch_cpu torch_python)
  find_library(KILN_TORCH_LIB_${_lib} ${_lib} PATHS ${KILN_TORCH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(kiln_torch INTERFACE ${KILN_TORCH_LIB_${_lib}})
endforeach()

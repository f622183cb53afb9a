# Locates PyTorch through the Python interpreter and, when it is there, builds
# python/ (the torch extension). MOK_TORCH=AUTO quietly skips without torch;
# MOK_TORCH=ON makes a missing torch an error.
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
set(_mok_torch_prefix "")
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _mok_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _mok_torch_rc ERROR_QUIET)
  if(NOT _mok_torch_rc EQUAL 0)
    set(_mok_torch_prefix "")
  endif()
endif()

if(_mok_torch_prefix STREQUAL "" OR NOT MOK_ENABLE_CUDA)
  if(MOK_TORCH STREQUAL "ON")
    message(FATAL_ERROR "MOK_TORCH=ON but torch (or CUDA) was not found")
  endif()
  message(STATUS "mok: torch not found; the PyTorch extension is not built")
else()
  list(APPEND CMAKE_PREFIX_PATH ${_mok_torch_prefix})
  # Without it torch's CMake config runs a program on the build machine's GPU
  # to pick architectures, which fails where there is none (a wheel built on
  # a CPU machine). mok builds sm_90a only, and the extension has no CUDA
  # sources of its own.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0a")
  endif()
  find_package(Torch REQUIRED)
  message(STATUS "mok: building the PyTorch extension against torch at ${_mok_torch_prefix}")
  add_subdirectory(python)
endif()

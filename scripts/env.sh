# Sourced by the scripts: the build preset and CMake arguments for this
# machine. CUDA is built wherever nvcc exists (CI included); without nvcc only
# the CPU part builds, and says so.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
MOK_CMAKE_ARGS=()
if command -v nvcc >/dev/null; then
  MOK_PRESET=default
else
  MOK_PRESET=cpu-only
  echo "note: no nvcc on this machine; building the CPU part only (preset cpu-only)" >&2
fi
MOK_BUILD_DIR=build
[ "$MOK_PRESET" = cpu-only ] && MOK_BUILD_DIR=build-cpu
# Machines without Debian's libgtest-dev (the GPU machine) build GoogleTest
# from a source tree: .deps/googletest if present, else Debian's sources.
if [ ! -f /usr/include/gtest/gtest.h ]; then
  for src in "$PWD/.deps/googletest" /usr/src/googletest; do
    if [ -f "$src/CMakeLists.txt" ]; then MOK_CMAKE_ARGS+=("-DMOK_GTEST_SOURCE=$src"); break; fi
  done
fi
MOK_JOBS=$(nproc 2>/dev/null || echo 2)

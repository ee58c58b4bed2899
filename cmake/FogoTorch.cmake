# Finds LibTorch, makes it safe to link on machines without a GPU driver, and makes every binary
# load the torch wheel's own CUDA libraries.
#
# Used by fogo's own build and by the installed fogoConfig.cmake, so a downstream project gets
# the same treatment.
#
# Why: Torch's CMake config links `caffe2::cuda` against `CUDA::cuda_driver` (libcuda.so). On a
# machine without a driver that resolves to the toolkit's stub, and the resulting binaries then
# need libcuda.so.1 at load time and fail to start. Neither fogo nor libtorch_cuda.so calls the
# driver API directly through that link (libtorch loads the driver lazily), so the dependency is
# removed from the interface here.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  # Without a GPU to detect, Torch would otherwise compile for every architecture it knows.
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures (Hopper: H100/H200)")
endif()
# Torch's config prints two warnings on every configure that say nothing about this build; both
# are met here at their cause, so that a first configure shows none:
# - "pytorch is not compatible with `CMAKE_CUDA_ARCHITECTURES` and will ignore its value": Torch's
#   cuda.cmake enables CUDA itself, which (policy CMP0104, NEW) defines CMAKE_CUDA_ARCHITECTURES
#   with nvcc's default, and then warns that it is defined. Torch chooses its own arch flags from
#   TORCH_CUDA_ARCH_LIST (above) and only for legacy FindCUDA targets, and fogo sets
#   CMAKE_CUDA_ARCHITECTURES to FOGO_CUDA_ARCHITECTURES after this (CMakeLists.txt) for its own
#   kernels. So CUDA is enabled under CMP0104's OLD behaviour inside Torch's config alone (the
#   variable is then left undefined, and there is nothing to warn about); fogo's targets are made
#   later under NEW, with fogo's architectures.
# - "library kineto not found": TorchConfig.cmake looks for a separate libkineto in every build,
#   but the wheel's shared libtorch_cpu.so has kineto linked in (it exports libkineto's symbols)
#   and ships no libkineto. The lookup's answer is set to the torch target, which TORCH_LIBRARIES
#   lists anyway: nothing more is linked. (A static LibTorch, which would need libkineto, is not
#   what fogo builds against.)
set(kineto_LIBRARY torch CACHE INTERNAL "kineto is linked into the torch wheel's libtorch_cpu.so")
unset(CMAKE_CUDA_ARCHITECTURES CACHE)  # a build folder configured before this change
cmake_policy(PUSH)
if(POLICY CMP0104)
  cmake_policy(SET CMP0104 OLD)
endif()
find_package(Torch REQUIRED)
cmake_policy(POP)
if(TARGET caffe2::cuda)
  get_target_property(_fogo_cuda_libs caffe2::cuda INTERFACE_LINK_LIBRARIES)
  if(_fogo_cuda_libs)
    list(REMOVE_ITEM _fogo_cuda_libs CUDA::cuda_driver)
    set_target_properties(caffe2::cuda PROPERTIES INTERFACE_LINK_LIBRARIES "${_fogo_cuda_libs}")
  endif()
endif()

# The torch wheel's own NCCL and CUDA runtime (site-packages/nvidia/*/lib), ahead of a system CUDA
# toolkit's, when linking and when loading.
#
# Why: libtorch_cuda.so needs libnccl.so.2 and libcudart.so.13 but has no RUNPATH (Python's torch
# loads them from the wheel by path first). A C++ binary would find them through the toolkit's
# directory that CUDA::cudart puts in its own RUNPATH, or through ld.so.cache: torch 2.15, built
# against NCCL 2.30, then failed to link against the toolkit's NCCL 2.28.9, and would run on the
# toolkit's cudart 13.0 under a torch built for 13.2. So the linker resolves libtorch_cuda's needs
# in the wheel first (-rpath-link), and every binary names the wheel's libnccl and libcudart
# itself (DT_NEEDED, whatever --as-needed says) with the wheel's directories first in its RUNPATH:
# the loader maps them before libtorch_cuda asks for them by name.
if(TARGET torch_cuda)
  get_filename_component(_fogo_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB _fogo_wheel_lib_dirs LIST_DIRECTORIES true "${_fogo_site}/nvidia/*/lib")
  find_library(FOGO_WHEEL_NCCL NAMES libnccl.so.2 PATHS "${_fogo_site}/nvidia/nccl/lib"
               NO_DEFAULT_PATH NO_CACHE)
  find_library(FOGO_WHEEL_CUDART NAMES libcudart.so.13 libcudart.so.12 PATHS ${_fogo_wheel_lib_dirs}
               NO_DEFAULT_PATH NO_CACHE)
  if(_fogo_wheel_lib_dirs AND FOGO_WHEEL_NCCL AND FOGO_WHEEL_CUDART)
    list(JOIN _fogo_wheel_lib_dirs ":" _fogo_wheel_path)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
      "LINKER:-rpath-link,${_fogo_wheel_path}" "LINKER:-rpath,${_fogo_wheel_path}"
      "SHELL:-Wl,--push-state,--no-as-needed ${FOGO_WHEEL_NCCL} ${FOGO_WHEEL_CUDART} -Wl,--pop-state")
  else()
    message(WARNING "fogo: no NCCL and CUDA runtime in the torch wheel's ${_fogo_site}/nvidia: "
                    "binaries load whichever the system provides")
  endif()
endif()

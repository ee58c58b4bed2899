# Finds LibTorch and makes it safe to link on machines without a GPU driver.
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
find_package(Torch REQUIRED)
if(TARGET caffe2::cuda)
  get_target_property(_fogo_cuda_libs caffe2::cuda INTERFACE_LINK_LIBRARIES)
  if(_fogo_cuda_libs)
    list(REMOVE_ITEM _fogo_cuda_libs CUDA::cuda_driver)
    set_target_properties(caffe2::cuda PROPERTIES INTERFACE_LINK_LIBRARIES "${_fogo_cuda_libs}")
  endif()
endif()

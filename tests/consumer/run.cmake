# ctest driver: install fogo into a scratch prefix, build tests/consumer against it with
# find_package(fogo), run it, and check that neither it nor fogo's binaries need libcuda.so.1
# (they must start on machines without a GPU driver).
# -D: FOGO_BUILD_DIR, FOGO_SOURCE_DIR, WORK_DIR, CHECK_BINARIES (;-list)
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install "${FOGO_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} -S "${FOGO_SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G Ninja
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -Wno-dev)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
foreach(binary IN LISTS CHECK_BINARIES ITEMS "${WORK_DIR}/build/consumer")
  execute_process(COMMAND readelf -d "${binary}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf failed on ${binary}")
  endif()
  if(dynamic MATCHES "libcuda\\.so")
    message(FATAL_ERROR "${binary} needs libcuda.so at load time:\n${dynamic}")
  endif()
endforeach()

# A consumer that finds another Torch (major.minor) than fogo was built against is refused at
# configure time, naming both: a fake Torch 2.99.0 package stands in for it.
set(fake "${WORK_DIR}/fake-torch")
file(WRITE "${fake}/TorchConfigVersion.cmake"
     "set(PACKAGE_VERSION 2.99.0)\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
file(WRITE "${fake}/TorchConfig.cmake"
     "set(TORCH_FOUND TRUE)\nset(TORCH_LIBRARIES \"\")\nset(TORCH_INSTALL_PREFIX \"${fake}\")\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${FOGO_SOURCE_DIR}/tests/consumer"
                        -B "${WORK_DIR}/build-other-torch" -G Ninja "-DTorch_DIR=${fake}"
                        "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -Wno-dev
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX REPLACE "[ \n]+" " " flat "${out}")
if(rc EQUAL 0 OR NOT flat MATCHES "fogo was built against Torch [0-9.]+, but this project found Torch 2\\.99\\.0")
  message(FATAL_ERROR "a consumer of another Torch was not refused by name (${rc}):\n${out}")
endif()

# The consumer loads the torch wheel's NCCL and CUDA runtime, not a system toolkit's.
execute_process(COMMAND ldd "${WORK_DIR}/build/consumer" OUTPUT_VARIABLE deps RESULT_VARIABLE rc)
if(deps MATCHES "libtorch_cuda\\.so => ([^ ]*)/torch/lib/")
  set(site "${CMAKE_MATCH_1}")
  foreach(lib nccl cudart)
    if(NOT deps MATCHES "lib${lib}\\.so[.0-9]* => ${site}/nvidia/")
      message(FATAL_ERROR "the consumer's lib${lib} is not the torch wheel's (${site}/nvidia):\n${deps}")
    endif()
  endforeach()
endif()

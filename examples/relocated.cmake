# ctest script: the trainers' command-line tests still pass from a copy of the test and trainer
# binaries in another directory (an installed tree, the GPU machine's .device/bin), and fail
# naming where they looked when the trainer is not beside them: they find it beside themselves,
# never by a path of the build tree.
#   cmake -DWORK_DIR=... -DPAIRS="tests_binary|trainer_binary,..." -P relocated.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
string(REPLACE "," ";" PAIRS "${PAIRS}")
foreach(pair IN LISTS PAIRS)
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 tests)
  list(GET pair 1 trainer)
  get_filename_component(tests_name "${tests}" NAME)
  get_filename_component(trainer_name "${trainer}" NAME)
  set(bin "${WORK_DIR}/${tests_name}")
  file(MAKE_DIRECTORY "${bin}")
  file(COPY "${tests}" "${trainer}" DESTINATION "${bin}")
  execute_process(COMMAND "${bin}/${tests_name}" --gtest_filter=Binary.*
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${tests_name} copied to ${bin} failed (exit ${rc}):\n${out}")
  endif()
  file(REMOVE "${bin}/${trainer_name}")
  execute_process(COMMAND "${bin}/${tests_name}" --gtest_filter=Binary.*
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(FIND "${out}" "${trainer_name} not found beside the test executable" found)
  if(rc EQUAL 0 OR found EQUAL -1)
    message(FATAL_ERROR "${tests_name} without ${trainer_name} beside it did not fail naming "
                        "where it looked (exit ${rc}):\n${out}")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "relocated test binaries find their trainers beside them")

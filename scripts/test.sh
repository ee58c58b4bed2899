#!/usr/bin/env bash
# The test suite: set-up, build, then the tests through ctest, on each supported torch
# (scripts/torch.sh).
#   scripts/test.sh                     CI: every test on the default torch, then a leg on each
#                                       other version: the library, the Python module, the C++
#                                       unit and distributed tests, the install check and the
#                                       Python tests (not the trainers, benches or wheel build,
#                                       which are the same code on every torch)
#   FOGO_TORCH=2.15.0 scripts/test.sh   every test on that version alone
# Extra arguments go to ctest. Exits non-zero when any leg failed; every leg runs regardless.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chosen=${FOGO_TORCH:-}
source "$root/scripts/torch.sh"

# The build folder keeps its last configuration: say what each leg builds.
everything="-DFOGO_BUILD_EXAMPLES=ON -DFOGO_BUILD_BENCH=ON -DFOGO_BUILD_TESTS=ON -DFOGO_BUILD_PYTHON=ON"
leg() {  # version, ctest arguments...
  local version=$1 started=$SECONDS
  shift
  echo "=== torch $version ($(fogo_build_dir "$version")/) ==="
  FOGO_TORCH=$version FOGO_CMAKE_ARGS=${FOGO_CMAKE_ARGS:-$everything} "$root/scripts/build.sh" ||
    return 1
  cd "$root/$(fogo_build_dir "$version")" || return 1
  # ctest runs two test processes at once on 2 cores: one intra-op thread each, or OpenMP's
  # spinning threads oversubscribe the machine and every test slows down several-fold.
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --output-on-failure -j "${FOGO_JOBS:-2}" "$@" |
    tee "$summary.log"
  local rc=${PIPESTATUS[0]} counts
  # ctest's "N% tests passed, F tests failed out of T": added up over the legs.
  counts=$(sed -n 's/.* tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' \
    "$summary.log" | tail -1)
  if [ -n "$counts" ]; then
    read -r f t <<<"$counts"
    failed_tests=$((failed_tests + f))
    passed_tests=$((passed_tests + t - f))
  fi
  echo "=== torch $version: ctest exit $rc, $((SECONDS - started)) s ==="
  return $rc
}
summary=$(mktemp)
trap 'rm -f "$summary" "$summary.log"' EXIT
passed_tests=0
failed_tests=0

if [ -n "$chosen" ]; then
  leg "$FOGO_TORCH" "$@"
  rc=$?
  echo "tests: $passed_tests passed, $failed_tests failed"
  exit $rc
fi
failed=()
leg "${FOGO_TORCH_VERSIONS[0]}" "$@" || failed+=("${FOGO_TORCH_VERSIONS[0]}")
for version in "${FOGO_TORCH_VERSIONS[@]:1}"; do
  # The scripts' own tests (gpu_check's rehearsal, its report, keep_runs, the include layers, the
  # live progress lines, the docs' picture) do not depend on torch.
  FOGO_CMAKE_ARGS="${everything/EXAMPLES=ON -DFOGO_BUILD_BENCH=ON/EXAMPLES=OFF -DFOGO_BUILD_BENCH=OFF}" \
    FOGO_SKIP_WHEEL=1 leg "$version" -E '^(gpu_report|keep_runs|gpu_check_rehearsal|include_layers|live_progress|doc_tools)$' "$@" || failed+=("$version")
done
if ((${#failed[@]})); then
  echo "test.sh: failed on torch ${failed[*]}" >&2
else
  echo "test.sh: every leg passed (torch ${FOGO_TORCH_VERSIONS[*]})"
fi
echo "tests: $passed_tests passed, $failed_tests failed"
((${#failed[@]} == 0))

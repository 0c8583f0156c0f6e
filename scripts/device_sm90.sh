#!/usr/bin/env bash
# One call on the GPU machine for the Hopper forward (src/cuda/sm90/), in the
# order that matters most when device time is short: (build), ptxas/SASS
# report, TMA/wgmma primitives alone, forward tests through the sm90 path (schedules v1, v2, v3; a hang is
# killed by its timeout), forward benchmark against torch FA2 and cuDNN, the
# rest of the GPU suite, compute-sanitizer subset. Logs go to $OUT.
#
#   device tool: run(command="bash scripts/device_sm90.sh", carry=["build-deps"])
#   (from a copy of this worktree, see HELPERS_COMMON.md: cd .dev-sm90 first)
# FA_PREBUILT=DIR: use DIR/libflashattn.so and DIR/tests/gpu/test_gpu built
# elsewhere (cmake -DFLASHATTN_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a
# -DFLASHATTN_CUDA_HEADDIMS="64;128;256" -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON, then
# `ninja flashattn test_gpu test_gpu_sm90 2>&1 | tee DIR/build.log`) and skip the build.
# FA_STAGES="build sass primitives smoke bench test sanitize"; FA_BENCH_ARGS; FA_SMOKE_TIMEOUT;
# FA_SMOKE_SCHEDULES (default "v2 v3"); FA_BENCH_SCHEDULES (default: those whose smoke passed).
# Persistent sm90 forward: its tests run in the smoke stage (FA_PERSISTENT_TIMEOUT, default 60 s);
# A/B timing with FA_BENCH_ARGS="--sm90-persistent-ab" (columns tile / persistent; raise FA_BENCH_TIMEOUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
STAGES=${FA_STAGES:-"build sass primitives smoke bench test sanitize"}
JOBS=$(nproc)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -n "${FA_PREBUILT:-}" ] && LD_LIBRARY_PATH=$PWD/$FA_PREBUILT:$LD_LIBRARY_PATH \
  ldd "$FA_PREBUILT/tests/gpu/test_gpu" | grep -q "not found"; then
  note "prebuilt binaries miss libraries here ($(ldd "$FA_PREBUILT/tests/gpu/test_gpu" | grep 'not found' | tr -s ' ' | tr '\n' ' ')): building"
  unset FA_PREBUILT
fi
BUILD=${FA_PREBUILT:-build}
TEST_BIN=$BUILD/tests/gpu/test_gpu
export LD_LIBRARY_PATH=$PWD/$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BUILD_LOG=$BUILD/build.log

note "== device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null), $JOBS cores, $(nvcc --version | tail -1)"

if has_stage build && [ -z "${FA_PREBUILT:-}" ]; then
  BUILD_LOG="$OUT/build.log"
  GTEST_ARGS=()
  if [ -d build-deps/googletest ] && ! ls /usr/lib/x86_64-linux-gnu/libgtest* >/dev/null 2>&1 &&
    ! ls /usr/local/lib/libgtest* >/dev/null 2>&1; then
    cmake -S build-deps/googletest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest >"$BUILD_LOG" 2>&1 &&
      ninja -C /tmp/gtest-build install >>"$BUILD_LOG" 2>&1 || note "gtest build FAILED"
    GTEST_ARGS=(-DGTest_ROOT=/tmp/gtest)
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_BENCH=OFF \
    -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON -DFLASHATTN_CUDA_HEADDIMS="64;128;256" -DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON \
    "-DFLASHATTN_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a" "${GTEST_ARGS[@]}" \
    >>"$BUILD_LOG" 2>&1 || { note "cmake FAILED"; tail -30 "$BUILD_LOG"; exit 1; }
  start=$(date +%s)
  timeout "${FA_BUILD_TIMEOUT:-150}" ninja -C build -j "$JOBS" flashattn test_gpu test_gpu_sm90 >>"$BUILD_LOG" 2>&1 ||
    { note "build FAILED"; grep -m20 -A5 "error" "$BUILD_LOG"; exit 1; }
  note "== build (sm80 64;128;256 + sm90 64;128;256, both dtypes, sm_90a, -j$JOBS): $(( $(date +%s) - start )) s"
fi

if has_stage sass; then
  # ptxas -v lines of the sm90 kernels, and HGMMA / local-memory counts in their SASS.
  grep -A2 "Compiling entry function '_ZN9flashattn4sm90" "$BUILD_LOG" 2>/dev/null | grep -E "spill" |
    sort | uniq -c >/tmp/sm90_sass.txt
  for obj in $(find "$BUILD" -name 'sm90_fwd_*.cu.o' | sort); do
    cuobjdump --dump-sass "$obj" >/tmp/sass.txt 2>/dev/null
    echo "$(basename "$obj"): HGMMA $(grep -c HGMMA /tmp/sass.txt) LDL/STL $(grep -cE 'LDL|STL' /tmp/sass.txt)"
  done >>/tmp/sm90_sass.txt
  note "== sm90 ptxas spills (count, line) and SASS per object:"
  tee -a "$SUMMARY" </tmp/sm90_sass.txt
fi

if has_stage primitives; then  # TMA and wgmma building blocks alone (tests/gpu/test_gpu_sm90_primitives.cu)
  timeout 30 "$BUILD/tests/gpu/test_gpu_sm90" >/tmp/primitives.log 2>&1
  note "== sm90 primitives: exit $?, $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|SKIPPED \] [0-9]' /tmp/primitives.log | tr '\n' ' ')"
  grep -E "Failure|got|Expected|Which is|error|tile \(" /tmp/primitives.log | head -20 | tee -a "$SUMMARY"
fi

smoke_ok=1
run_tests() {  # name, filter, timeout, extra env
  local name=$1 filter=$2 limit=$3
  shift 3
  env "$@" timeout "$limit" "$TEST_BIN" --gtest_filter="$filter" >"$OUT/tests_$name.log" 2>&1
  local status=$?
  note "== tests $name ($*): exit $status, $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test' "$OUT/tests_$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/tests_$name.log" | head -12 | tee -a "$SUMMARY"
  grep -m2 -A10 "Failure" "$OUT/tests_$name.log" | head -30 >>"$SUMMARY"
  grep "forward kernel path" "$OUT/tests_$name.log" | tee -a "$SUMMARY"
  [ $status -eq 124 ] && note "$name TIMED OUT (hang?): $(tail -2 "$OUT/tests_$name.log" | tr '\n' ' ')"
  return $status
}
if has_stage smoke; then
  run_tests fwd_v1 'Cases/GpuForward.*:GpuKernelPath.*:GpuGraph.*:GpuDropout.*:GpuBadInput.*' \
    "${FA_SMOKE_TIMEOUT:-45}"
  status=$?
  [ $status -eq 124 ] || [ $status -ge 128 ] && smoke_ok=0  # a hang or crash: the benchmark would not finish
  # Other consumer schedules: benchmarked only where their forward tests passed.
  BENCH_SCHEDULES=""
  for schedule in ${FA_SMOKE_SCHEDULES-v2 v3}; do
    run_tests "fwd_$schedule" 'Cases/GpuForward.*' 20 FLASHATTN_SM90_SCHEDULE=$schedule &&
      BENCH_SCHEDULES="$BENCH_SCHEDULES $schedule"
  done
  export FA_BENCH_SCHEDULES=${FA_BENCH_SCHEDULES-$BENCH_SCHEDULES}
  # The persistent forward (FLASHATTN_SM90_PERSISTENT=1, set by these tests themselves): the shared
  # cases, the many-tile cases and the path / bit-identity checks against one tile per CTA.
  run_tests fwd_persistent '*GpuForwardPersistent.*:GpuKernelPath.*' "${FA_PERSISTENT_TIMEOUT:-60}"
  status=$?
  if [ $status -eq 124 ] || [ $status -ge 128 ]; then  # a hang or crash: no persistent columns in the benchmark
    FA_BENCH_ARGS=${FA_BENCH_ARGS:-}
    FA_BENCH_ARGS=${FA_BENCH_ARGS//--sm90-persistent-ab/}
  fi
fi

if has_stage bench && [ $smoke_ok -eq 1 ]; then
  # At most 8 files come back from $OUT: the bench's own log stays in /tmp.
  mkdir -p /tmp/bench_out
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/$BUILD/libflashattn.so timeout "${FA_BENCH_TIMEOUT:-70}" \
    python3 bench/gpu/bench_gpu.py --out /tmp/bench_out --fwd-only ${FA_BENCH_ARGS:-} \
    >"$OUT/bench_fwd_table.txt" 2>/tmp/bench_stderr.log
  note "== benchmark exit $?"
  cp /tmp/bench_out/bench_gpu_fwd.json "$OUT/" 2>/dev/null || cp /tmp/bench_out/bench_gpu.log "$OUT/"
  tail -3 /tmp/bench_stderr.log >>"$SUMMARY"
fi

if has_stage test; then  # the rest of the GPU suite (backward, determinism: sm80 kernels)
  run_tests rest '-SlowCases*:Cases/GpuForward.*:*GpuForwardPersistent.*:GpuKernelPath.*:GpuGraph.*:GpuDropout.*:GpuBadInput.*' \
    "${FA_TEST_TIMEOUT:-25}"
fi

if has_stage sanitize && [ $smoke_ok -eq 1 ]; then
  for tool in memcheck racecheck; do
    timeout "${FA_SANITIZER_TIMEOUT:-15}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$TEST_BIN" \
      --gtest_filter='GpuSanitizer.*' >>"$OUT/sanitizer.log" 2>&1
    status=$?
    note "== compute-sanitizer $tool: exit $status, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Device not supported' "$OUT/sanitizer.log" | tail -1)"
    [ $status -eq 0 ] || grep -m6 -E "Invalid|Race|hazard|Error|error" "$OUT/sanitizer.log" | tee -a "$SUMMARY"
  done
fi

cat "$SUMMARY"
[ -f "$OUT/bench_fwd_table.txt" ] && cat "$OUT/bench_fwd_table.txt"
exit 0

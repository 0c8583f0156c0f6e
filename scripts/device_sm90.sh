#!/usr/bin/env bash
# One call on the GPU machine for the Hopper forward (src/cuda/sm90/): build,
# ptxas/SASS report of the sm90 kernels, forward smoke test (hangs are killed),
# the GPU test suite, compute-sanitizer subset, forward benchmark against torch
# FA2 and cuDNN. Logs go to $OUT; a short summary is printed last.
#
#   device tool: run(command="bash scripts/device_sm90.sh", carry=["build-deps"])
#   (from a copy of this worktree, see HELPERS_COMMON.md: cd .dev-sm90 first)
# Knobs: FA_STAGES="build sass smoke test sanitize bench", FA_HEADDIMS (sm80
# classes; sm90 builds 64/128/256 from them), FA_BENCH_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
STAGES=${FA_STAGES:-"build sass smoke test sanitize bench"}
JOBS=$(nproc)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
TEST_BIN=./build/tests/gpu/test_gpu

note "== device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null), $JOBS cores, $(nvcc --version | tail -1)"

if has_stage build; then
  GTEST_ARGS=()
  if [ -d build-deps/googletest ] && ! ls /usr/lib/x86_64-linux-gnu/libgtest* >/dev/null 2>&1 &&
    ! ls /usr/local/lib/libgtest* >/dev/null 2>&1; then
    cmake -S build-deps/googletest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest >"$OUT/build.log" 2>&1 &&
      ninja -C /tmp/gtest-build install >>"$OUT/build.log" 2>&1 || note "gtest build FAILED"
    GTEST_ARGS=(-DGTest_ROOT=/tmp/gtest)
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_BENCH=OFF \
    -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON -DFLASHATTN_CUDA_HEADDIMS="${FA_HEADDIMS:-64;128;256}" "${GTEST_ARGS[@]}" \
    >>"$OUT/build.log" 2>&1 || { note "cmake FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  start=$(date +%s)
  ninja -C build -j "$JOBS" flashattn test_gpu >>"$OUT/build.log" 2>&1 ||
    { note "build FAILED"; grep -m20 -A5 "error" "$OUT/build.log"; exit 1; }
  note "== build (sm80 ${FA_HEADDIMS:-64;128;256} + sm90 64;128;256, both dtypes, -j$JOBS): $(( $(date +%s) - start )) s"
fi

if has_stage sass; then
  # ptxas -v lines of the sm90 kernels, and HGMMA / local-memory counts in their SASS.
  grep -A2 "Compiling entry function '_ZN9flashattn4sm90" "$OUT/build.log" | grep -E "registers|spill" |
    sort | uniq -c >"$OUT/sm90_ptxas.txt"
  for obj in $(find build -name 'sm90_fwd_*.cu.o' | sort); do
    cuobjdump --dump-sass "$obj" >/tmp/sass.txt 2>/dev/null
    echo "$(basename "$obj"): HGMMA $(grep -c HGMMA /tmp/sass.txt) STL $(grep -c 'STL' /tmp/sass.txt) LDL $(grep -c 'LDL' /tmp/sass.txt)"
  done >>"$OUT/sm90_ptxas.txt"
  note "== sm90 ptxas/SASS:"; cat "$OUT/sm90_ptxas.txt" | tee -a "$SUMMARY"
fi

smoke_ok=1
if has_stage smoke; then
  # Every forward case of the shared list in one process: a deadlock is killed, failures are listed.
  timeout "${FA_SMOKE_TIMEOUT:-90}" "$TEST_BIN" --gtest_filter='Cases/GpuForward.*:GpuKernelPath.*' \
    >"$OUT/smoke.log" 2>&1
  status=$?
  note "== forward smoke (sm90 path): exit $status, $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUT/smoke.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] Cases" "$OUT/smoke.log" | head -15 | tee -a "$SUMMARY"
  grep -m3 -B2 -A12 "Failure" "$OUT/smoke.log" | head -60 >>"$SUMMARY"
  grep "forward kernel path" "$OUT/smoke.log" | tee -a "$SUMMARY"
  [ $status -eq 0 ] || smoke_ok=0
  [ $status -eq 124 ] && note "smoke TIMED OUT (hang?); last lines:" && tail -5 "$OUT/smoke.log" | tee -a "$SUMMARY"
fi

if has_stage test && [ $smoke_ok -eq 1 ]; then
  start=$(date +%s)
  (cd build && timeout "${FA_TEST_TIMEOUT:-200}" ctest -L gpu -LE slow -j 8 --output-on-failure --timeout 120) \
    >"$OUT/gpu_tests.log" 2>&1
  note "== GPU tests: exit $? in $(( $(date +%s) - start )) s: $(grep -E 'tests passed' "$OUT/gpu_tests.log")"
  grep -E "\*\*\*Failed|Timeout" "$OUT/gpu_tests.log" | head -20 | tee -a "$SUMMARY"
fi

if has_stage sanitize && [ $smoke_ok -eq 1 ]; then
  for tool in memcheck racecheck; do
    timeout "${FA_SANITIZER_TIMEOUT:-100}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$TEST_BIN" \
      --gtest_filter='GpuSanitizer.*' >"$OUT/sanitizer_$tool.log" 2>&1
    status=$?
    note "== compute-sanitizer $tool: exit $status, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
    [ $status -eq 0 ] || grep -m10 -E "Invalid|Race|hazard|Error" "$OUT/sanitizer_$tool.log" | tee -a "$SUMMARY"
  done
fi

if has_stage bench && [ $smoke_ok -eq 1 ]; then
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_BENCH_TIMEOUT:-180}" \
    python3 bench/gpu/bench_gpu.py --out "$OUT" --fwd-only ${FA_BENCH_ARGS:-} >"$OUT/bench_fwd_table.txt" \
    2>"$OUT/bench_stderr.log"
  note "== benchmark exit $?"
  tail -3 "$OUT/bench_stderr.log" >>"$SUMMARY"
fi

cat "$SUMMARY"
[ -f "$OUT/bench_fwd_table.txt" ] && cat "$OUT/bench_fwd_table.txt"
exit 0

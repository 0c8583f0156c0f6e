#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, compute-sanitizer subset,
# benchmark. Logs and JSON go to $OUT; a short table is printed last.
#
#   device tool: run(command="bash scripts/device_run.sh", carry=["build-deps"])
#
# build-deps/googletest (git-ignored; make it here first with
# `mkdir -p build-deps && cp -r /usr/src/googletest build-deps/`) is built on the
# device when the machine has no GTest. A full run takes about 180 s there.
# Environment knobs:
#   FA_STAGES="build test sanitize bench cpu"  stages to run (default; also "alt": A/B tile builds,
#                                            "python": pip install, then FA_PYTHON_PARTS (default "pytest cli
#                                              train": pytest on CUDA (FA_PYTEST_FILES: only these files of
#                                              python/tests), bench CLI plots, train_gpt); FA_PIP_ARGS: more
#                                              pip arguments, e.g. --config-settings=cmake.define.FLASHATTN_CUDA_GENCODE=...
#                                            "profile": ncu on the backward kernel (FA_PROFILE_VARIANTS:
#                                              comma-separated profile_bwd.py flags; FA_NCU_ARGS: more ncu
#                                              arguments, e.g. "--section SourceCounters --print-details all"),
#                                            "fwdtable": issue 5's forward table (1k-16k, tile/persistent),
#                                            "decode": the KV-cache decode benchmark against copy and SDPA,
#                                            "decodecost": a decode call's fixed cost (bench/gpu/decode_fixed_cost.py),
#                                            "readfloor": what a kernel that only reads reaches per call for the
#                                              decode cells' byte counts (bench/gpu/read_floor.cu),
#                                            "timeline": the decode kernels' per-block globaltimer stamps
#                                              (dev/decode_timeline.py) of each tree in FA_TIMELINE_SRC
#                                              (dev/decode_diagnostic_trees.py timeline ...), hdim 128 builds,
#                                            "overhead": host cost of the Python op layer on CUDA,
#                                            "reference": A/B against FA_REFERENCE_SRC in one process,
#                                            "extrasab": softcap/dropout kernels against build-ref (reference stage),
#                                            "variants": builds with FA_VARIANTS' defines, A/B in one process)
#   FA_HEADDIMS="64;128;192;256"            head-dim classes to compile
#   FA_GENCODE=""                            CMake's FLASHATTN_CUDA_GENCODE (default: sm_80 + sm_90a)
#   FA_BENCH_ARGS=""                         extra arguments of bench_gpu.py (e.g. --quick)
#   FA_TEST_FILTER=""                        gtest filter of the GPU tests (default: all but slow)
#   FA_SANITIZERS="memcheck racecheck"       compute-sanitizer tools
#   FA_SANITIZE_FILTER="GpuSanitizer.*:GpuDropout.*"  their gtest filter (parametrized cases are named
#                                            Cases/Suite.Test/case: '*GpuKvCache*' takes every KV-cache test)
#   FA_REQUIRE_GPU=""                        e.g. "H200": on any GPU whose name lacks it, say so and stop
#                                            before building (a call that may land on an H100 costs seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT"
STAGES=${FA_STAGES:-"build test sanitize bench cpu"}  # also: alt
JOBS=$(nproc)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

note "== device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null), $JOBS cores"
if [ -n "${FA_REQUIRE_GPU:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null |
  grep -q -- "$FA_REQUIRE_GPU"; then
  note "== FA_REQUIRE_GPU=$FA_REQUIRE_GPU: not this GPU, nothing run"
  exit 0
fi
note "== nvcc: $(nvcc --version | tail -1)"

if has_stage build; then
  GTEST_ARGS=()
  if [ -d build-deps/googletest ] && ! ls /usr/lib/x86_64-linux-gnu/libgtest* >/dev/null 2>&1 &&
    ! ls /usr/local/lib/libgtest* >/dev/null 2>&1; then
    cmake -S build-deps/googletest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest >"$OUT/build.log" 2>&1 &&
      ninja -C /tmp/gtest-build install >>"$OUT/build.log" 2>&1 || { note "gtest build FAILED"; }
    GTEST_ARGS=(-DGTest_ROOT=/tmp/gtest)
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_BENCH=OFF \
    -DFLASHATTN_CUDA_HEADDIMS="${FA_HEADDIMS:-64;128;192;256}" ${FA_GENCODE:+-DFLASHATTN_CUDA_GENCODE="$FA_GENCODE"} \
    "${GTEST_ARGS[@]}" >>"$OUT/build.log" 2>&1 ||
    { note "cmake FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1; }
  start=$(date +%s%N)
  ninja -C build -j "$JOBS" flashattn >>"$OUT/build.log" 2>&1 || { note "library build FAILED"; grep -m20 -A5 error "$OUT/build.log"; exit 1; }
  lib_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  note "== libflashattn (all CUDA kernels, sm_80 + sm_90a, -j$JOBS): $((lib_ms / 1000)).$(( (lib_ms % 1000) / 100 )) s"
  test_targets=(test_gpu)
  # grep -q over a pipe would end ninja early (SIGPIPE), which pipefail reads as a failure.
  grep -q '^test_gpu_sm90:' <(ninja -C build -t targets all) && test_targets+=(test_gpu_sm90)
  ninja -C build -j "$JOBS" "${test_targets[@]}" >>"$OUT/build.log" 2>&1 ||
    { note "test build FAILED"; grep -m20 -A5 error "$OUT/build.log"; exit 1; }
fi

if has_stage test; then
  start=$(date +%s)
  # The shared case lists hold D = 64, 128 and 256 cases, and the tests do not skip a class the build left out.
  for class in 64 128 256; do
    [[ ";${FA_HEADDIMS:-64;128;192;256};" == *";$class;"* ]] ||
      note "== warning: FA_HEADDIMS lacks the $class class: the GPU tests' cases of that class fail"
  done
  if [ -n "${FA_TEST_FILTER:-}" ]; then
    timeout "${FA_TEST_TIMEOUT:-240}" ./build/tests/gpu/test_gpu --gtest_filter="$FA_TEST_FILTER" >"$OUT/gpu_tests.log" 2>&1
    status=$?
  else
    (cd build && timeout "${FA_TEST_TIMEOUT:-240}" ctest -L gpu -LE slow -j 8 --output-on-failure --timeout 120) >"$OUT/gpu_tests.log" 2>&1
    status=$?
  fi
  note "== GPU tests: exit $status in $(( $(date +%s) - start )) s: $(grep -E 'tests passed|PASSED|FAILED  *\]' "$OUT/gpu_tests.log" | head -3 | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failed|\*\*\*Failed" "$OUT/gpu_tests.log" | head -20 | tee -a "$SUMMARY"
fi

if has_stage sanitize; then
  # Sanitizer output goes into gpu_tests.log: at most 8 files come back from $OUT.
SANITIZER_LOG="$OUT/gpu_tests.log"
  for tool in ${FA_SANITIZERS:-memcheck racecheck}; do
    timeout "${FA_SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 9 ./build/tests/gpu/test_gpu \
      --gtest_filter="${FA_SANITIZE_FILTER:-GpuSanitizer.*:GpuDropout.*}" >>"$SANITIZER_LOG" 2>&1
    status=$?
    note "== compute-sanitizer $tool: exit $status, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$SANITIZER_LOG" | tail -1)"
  done
fi

if has_stage bench; then
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_BENCH_TIMEOUT:-300}" \
    python3 bench/gpu/bench_gpu.py --out "$OUT" ${FA_BENCH_ARGS:-} >"$OUT/bench_table.txt" 2>"$OUT/bench_stderr.log"
  note "== benchmark exit $?"
  tail -5 "$OUT/bench_stderr.log" >>"$SUMMARY"
fi

# A/B against another source tree of this library (FA_REFERENCE_SRC, e.g. `git archive` of the
# previous commit unpacked under build-deps/, which travels by carry): built for sm_90a with
# classes 64/128/256 (FA_REFERENCE_HEADDIMS; "128" where only the decode table times them), then
# the bench grid (FA_REFERENCE_DTYPES, default bf16; FA_REFERENCE_ARGS, more bench_gpu.py
# arguments such as "--dims 128") times both builds in the same rounds (bench_gpu.py
# --reference-lib); FA_REFERENCE_BENCH=0 only builds it. A decode
# stage in the same call times build-ref's decode too (a build-ref left by an earlier call is not used).
# FA_REFERENCE_SRC may name more trees, separated by spaces: the second is built in build-ref2 and so
# on, and only the decode stage times those (columns ref2_ms, ...).
DECODE_REFERENCES=()
build_reference() {  # build_reference SOURCE_TREE BUILD_DIR
  # A build dir an earlier call of this machine configured from another tree: CMake refuses to reuse it.
  if [ -f "$2/CMakeCache.txt" ] &&
    ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$(cd "$1" && pwd)" "$2/CMakeCache.txt"; then
    rm -rf "$2"
  fi
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_TESTS=OFF \
    -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_CUDA_HEADDIMS="${FA_REFERENCE_HEADDIMS:-64;128;256}" \
    -DFLASHATTN_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" >>"$OUT/reference_build.log" 2>&1 &&
    ninja -C "$2" -j "$JOBS" flashattn >>"$OUT/reference_build.log" 2>&1
}
if has_stage reference; then
  start=$(date +%s)
  : >"$OUT/reference_build.log"
  read -r -a reference_trees <<<"${FA_REFERENCE_SRC:?a source tree to compare against}"
  reference_status=1
  for i in "${!reference_trees[@]}"; do
    dir=build-ref$( [ "$i" = 0 ] || echo $((i + 1)) )
    if build_reference "${reference_trees[$i]}" "$dir"; then
      DECODE_REFERENCES+=(--reference-lib "$dir/libflashattn.so")
      [ "$i" = 0 ] && reference_status=0
    else
      note "== reference build $dir FAILED"
    fi
  done
  if [ "$reference_status" != 0 ]; then
    note "== reference build FAILED"; grep -m10 -A3 error "$OUT/reference_build.log" >>"$SUMMARY"
  elif [ "${FA_REFERENCE_BENCH:-1}" = 0 ]; then
    note "== reference build only (FA_REFERENCE_BENCH=0): $(( $(date +%s) - start )) s"
  else
    mkdir -p /tmp/reference_bench
    PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_REFERENCE_TIMEOUT:-300}" \
      python3 bench/gpu/bench_gpu.py --out /tmp/reference_bench --skip-extra --dtypes "${FA_REFERENCE_DTYPES:-bf16}" ${FA_REFERENCE_ARGS:-} \
      --reference-lib "$PWD/build-ref/libflashattn.so" >"$OUT/bench_reference.txt" 2>>"$OUT/reference_build.log"
    note "== reference A/B: exit $?, $(( $(date +%s) - start )) s"
    cp /tmp/reference_bench/bench_gpu.json "$OUT/bench_gpu_reference.json"
  fi
fi

# The kernels' extras variant (softcap, dropout; dropout also with its seed read from device memory)
# against build-ref (the reference stage, FA_REFERENCE_BENCH=0 to build it only), same rounds, bf16; each
# cell checks that both builds give the same bytes (bench/gpu/bench_extras_ab.py; FA_EXTRAS_ARGS: its
# --dims/--lengths, and --ref-rngptr to time build-ref's seed-in-memory kernels too).
if has_stage extrasab; then
  start=$(date +%s)
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_EXTRAS_TIMEOUT:-240}" \
    python3 bench/gpu/bench_extras_ab.py --out "$OUT" --reference-lib "$PWD/build-ref/libflashattn.so" \
    ${FA_EXTRAS_ARGS:-} >"$OUT/bench_extras_ab.txt" 2>>"$OUT/bench_stderr.log"
  note "== extras A/B: exit $?, $(( $(date +%s) - start )) s"
fi

# Issue 5's forward table (N = 1k, 4k, 8k, 16k): ours, one tile per CTA and persistent, FA2, cuDNN, and
# build-ref's default forward when the reference stage built it in this call (column ref).
if has_stage fwdtable; then
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_FWDTABLE_TIMEOUT:-200}" \
    python3 bench/gpu/bench_gpu.py --out "$OUT" --fwd-only --sm90-persistent-ab ${FA_FWDTABLE_ARGS:-} \
    $(has_stage reference && [ -f build-ref/libflashattn.so ] && echo --reference-lib build-ref/libflashattn.so) \
    >"$OUT/bench_fwd_table.txt" 2>>"$OUT/bench_stderr.log"
  note "== forward table exit $?"
fi

# Variants of this tree (FA_VARIANTS="label:-DNAME=VALUE ...", e.g. a development switch): each is
# built for sm_90a (classes 64/128/256, bf16) with the define added to the C++ and CUDA flags, then
# bench_variants.py times this build's default and deterministic fwd+bwd and each variant's
# deterministic fwd+bwd in the same rounds (FA_VARIANT_ARGS: its --dims/--lengths; FA_VARIANT_BASE: the
# library of the default and det columns instead of build/, e.g. one of the variants).
if has_stage variants; then
  libs=()
  start=$(date +%s)
  for variant in ${FA_VARIANTS:?label:-DNAME=VALUE ...}; do  # the builds share the cores
    label=${variant%%:*} define=${variant#*:}
    (cmake -S . -B "build-var-$label" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
      -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_CUDA_HEADDIMS="64;128;256" \
      -DFLASHATTN_CUDA_DTYPES=bf16 -DFLASHATTN_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" \
      -DCMAKE_CXX_FLAGS="$define" -DCMAKE_CUDA_FLAGS="$define" >"$OUT/variant_$label.log" 2>&1 &&
      ninja -C "build-var-$label" -j "$JOBS" flashattn >>"$OUT/variant_$label.log" 2>&1) &
  done
  wait
  for variant in $FA_VARIANTS; do
    label=${variant%%:*}
    if [ -f "build-var-$label/libflashattn.so" ]; then libs+=("$label=$PWD/build-var-$label/libflashattn.so")
    else note "== variant $label: build FAILED"; grep -m5 -A3 error "$OUT/variant_$label.log" >>"$SUMMARY"; fi
  done
  note "== variants built: ${#libs[@]} in $(( $(date +%s) - start )) s"
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=${FA_VARIANT_BASE:-$PWD/build/libflashattn.so} timeout "${FA_VARIANT_TIMEOUT:-300}" \
    python3 bench/gpu/bench_variants.py --out "$OUT" ${FA_VARIANT_ARGS:-} "${libs[@]}" >"$OUT/bench_variants.txt" 2>&1
  note "== variants bench exit $?"
fi

# Decode (Sq = 1) against a device-to-device copy and torch SDPA on the same cache.
if has_stage decode; then
  PYTHONUNBUFFERED=1 timeout "${FA_DECODE_TIMEOUT:-240}" python3 bench/gpu/bench_decode.py --lib build/libflashattn.so \
    --out "$OUT" ${FA_DECODE_ARGS:-} "${DECODE_REFERENCES[@]}" >"$OUT/decode_table.txt" 2>&1
  note "== decode benchmark exit $?"
  cat "$OUT/decode_table.txt" >>"$SUMMARY"
fi

# Where a decode call's fixed cost goes: ours (1 / 2 / heuristic splits, with and without PDL), cuDNN and
# trivial kernel nodes on caches of 16 to 4,096 keys.
if has_stage decodecost; then
  PYTHONUNBUFFERED=1 timeout "${FA_DECODECOST_TIMEOUT:-150}" python3 bench/gpu/decode_fixed_cost.py \
    --lib build/libflashattn.so --out "$OUT" >"$OUT/decode_fixed_cost.txt" 2>&1
  note "== decode fixed cost: exit $?"
  cat "$OUT/decode_fixed_cost.txt" >>"$SUMMARY"
fi

# What a read-only kernel reaches for the decode cells' byte counts, against the same copy (bench/gpu/read_floor.cu).
if has_stage readfloor; then
  nvcc -O3 -std=c++17 -I src -I include ${FA_GENCODE:--gencode=arch=compute_90a,code=sm_90a} bench/gpu/read_floor.cu \
    -o /tmp/read_floor >"$OUT/read_floor.txt" 2>&1 &&
    timeout "${FA_READFLOOR_TIMEOUT:-120}" /tmp/read_floor ${FA_READFLOOR_ARGS:-} --json "$OUT/read_floor.json" >>"$OUT/read_floor.txt" 2>&1
  note "== read floor: exit $?"
  cat "$OUT/read_floor.txt" >>"$SUMMARY"
fi

# Where a decode call's time goes, block by block: trees with the timeline stamps, built for hdim 128 only.
if has_stage timeline; then
  : >"$OUT/timeline.txt"
  read -r -a timeline_trees <<<"${FA_TIMELINE_SRC:?timeline trees (dev/decode_diagnostic_trees.py)}"
  for tree in "${timeline_trees[@]}"; do
    dir=build-timeline-$(basename "$tree")
    if cmake -S "$tree" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_TESTS=OFF \
         -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_CUDA_HEADDIMS="128" \
         -DFLASHATTN_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" >>"$OUT/timeline_build.log" 2>&1 &&
       ninja -C "$dir" -j "$JOBS" flashattn >>"$OUT/timeline_build.log" 2>&1; then
      PYTHONUNBUFFERED=1 timeout "${FA_TIMELINE_TIMEOUT:-120}" python3 dev/decode_timeline.py \
        --lib "$dir/libflashattn.so" --label "$(basename "$tree")" --out "$OUT" ${FA_TIMELINE_ARGS:-} \
        >>"$OUT/timeline.txt" 2>&1
      note "== timeline $(basename "$tree"): exit $?"
    else
      note "== timeline build $dir FAILED"; grep -m10 -A3 error "$OUT/timeline_build.log" >>"$SUMMARY"
    fi
  done
  cat "$OUT/timeline.txt" >>"$SUMMARY"
fi

# The CPU backend against torch's CPU SDPA on this host's cores, same process.
if has_stage cpu; then
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_CPU_TIMEOUT:-150}" \
    python3 bench/cpu_vs_torch.py --threads "${FA_CPU_THREADS:-$JOBS}" --reps 3 --json "$OUT/cpu_vs_torch.json" \
    >/tmp/cpu_vs_torch.txt 2>&1
  note "== CPU vs torch exit $?"
  cat /tmp/cpu_vs_torch.txt >>"$OUT/bench_table.txt"
  PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build/libflashattn.so timeout "${FA_CPU_DECODE_TIMEOUT:-90}" \
    python3 bench/cpu_decode.py --threads "${FA_CPU_THREADS:-$JOBS}" --reps 5 --json "$OUT/cpu_decode.json" \
    >/tmp/cpu_decode.txt 2>&1
  note "== CPU decode vs torch exit $?"
  cat /tmp/cpu_decode.txt >>"$OUT/bench_table.txt"
fi

# A/B: alternative tiles in extra libraries (bf16, hdim 64/128/256, sm_90a only),
# timed ours-only after the main benchmark. FA_ALT_CONFIGS lists them, separated by
# spaces, each "name/fwd128/bwd64/bwd128/bwd256" with the tiles of tile_config.hpp
# ("-" keeps the default).
if has_stage alt; then
  for config in ${FA_ALT_CONFIGS:-"fa2like/-/64,128,8,4,4,2,2/64,128,8,4,4,2,2/64,64,8,4,2,2,2"}; do
    IFS=/ read -r name fwd128 bwd64 bwd128 bwd256 <<<"$config"
    tiles=()
    [ "$fwd128" != "-" ] && tiles+=(-DFLASHATTN_CUDA_FWD128_TILE="$fwd128")
    [ "$bwd64" != "-" ] && tiles+=(-DFLASHATTN_CUDA_BWD64_TILE="$bwd64")
    [ "$bwd128" != "-" ] && tiles+=(-DFLASHATTN_CUDA_BWD128_TILE="$bwd128")
    [ "$bwd256" != "-" ] && tiles+=(-DFLASHATTN_CUDA_BWD256_TILE="$bwd256")
    start=$(date +%s)
    cmake -S . -B "build-alt-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_TESTS=OFF \
      -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_CUDA_HEADDIMS="64;128;256" -DFLASHATTN_CUDA_DTYPES=bf16 \
      -DFLASHATTN_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON "${tiles[@]}" \
      >"/tmp/alt_$name.log" 2>&1 && ninja -C "build-alt-$name" -j "$JOBS" flashattn >>"/tmp/alt_$name.log" 2>&1
    built=$?
    note "   $name: $(grep -cE ' [1-9][0-9]* bytes spill stores' "/tmp/alt_$name.log") kernels with spill stores"
    if [ $built -eq 0 ]; then
      mkdir -p "/tmp/alt_$name" && PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build-alt-$name/libflashattn.so timeout 150 \
        python3 bench/gpu/bench_gpu.py --out "/tmp/alt_$name" --ours-only --skip-extra --dtypes bf16 \
        --label "$name" >>"$OUT/bench_table.txt" 2>&1
      note "== A/B $name (fwd128 $fwd128, bwd64 $bwd64, bwd128 $bwd128, bwd256 $bwd256): build+bench exit $?, $(( $(date +%s) - start )) s"
    else
      note "== A/B $name build FAILED"; grep -m5 -A3 error "/tmp/alt_$name.log" >>"$SUMMARY"
    fi
  done
fi

# Nsight Compute on the backward kernel (hdim 128, 16k, bf16): warp stall reasons, pipe use,
# shared-memory traffic; the report lands in the packed logs. FA_PROFILE_VARIANTS: profile_bwd.py flag
# sets, separated by commas (default ",--causal": the default order, then causal); FA_PROFILE_KERNEL:
# the kernel-name regex (default bwd_kernel; fwd_kernel profiles the forward of the same calls).
if has_stage profile; then
  kernel=${FA_PROFILE_KERNEL:-bwd_kernel}
  IFS=, read -ra profile_variants <<<"${FA_PROFILE_VARIANTS:-,--causal}"
  for variant in "${profile_variants[@]}"; do
    timeout "${FA_PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy ${FA_NCU_ARGS:-} \
      env FLASHATTN_LIB=$PWD/build/libflashattn.so python3 bench/gpu/profile_bwd.py --dim 128 $variant \
      >"$OUT/ncu_${kernel}${variant//[- ]/_}.txt" 2>&1
    status=$?
    # FA_NCU_SOURCE=1: per-instruction counts and stall samples (the source page, SASS) as CSV.
    if [ "${FA_NCU_SOURCE:-0}" = 1 ]; then
      report=/tmp/ncu_source${variant//[- ]/_}
      timeout "${FA_PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 \
        --launch-count 1 --section SourceCounters -f -o "$report" \
        env FLASHATTN_LIB=$PWD/build/libflashattn.so python3 bench/gpu/profile_bwd.py --dim 128 $variant >/dev/null 2>&1 &&
        ncu -i "$report.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ncu_source${variant//[- ]/_}.csv.gz"
      note "== ncu source page $variant: exit $?, $(zcat "$OUT/ncu_source${variant//[- ]/_}.csv.gz" | wc -l) lines"
    fi
    note "== ncu $kernel hdim128 $variant: exit $status, $(grep -m1 -E 'Duration' "$OUT/ncu_${kernel}${variant//[- ]/_}.txt" | tr -s ' '),$(grep -m1 -E 'Compute \(SM\) Throughput' "$OUT/ncu_${kernel}${variant//[- ]/_}.txt" | tr -s ' ')"
  done
fi

# The Python package on CUDA tensors: pip install ./ (all kernels), pytest, the bench CLI with its
# plots and the long-context GPT training example (loss curves and memory, flashattn vs sdpa vs math).
if has_stage python; then
  start=$(date +%s)
  FLASHATTN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$JOBS timeout "${FA_PIP_TIMEOUT:-300}" \
    python3 -m pip install --no-build-isolation --no-deps --no-index -q ${FA_PIP_ARGS:-} . >"$OUT/python.log" 2>&1
  note "== pip install ./ (CUDA): exit $? in $(( $(date +%s) - start )) s"
  parts=" ${FA_PYTHON_PARTS:-pytest cli train} "
  if [[ "$parts" == *" pytest "* ]]; then
    start=$(date +%s)
    # -rfEs lists each failure, error and skip (with its reason): on a GPU only the CPU-only cases should skip.
    # FA_PYTEST_FILES: test files under python/tests instead of all of them.
    targets=("$PWD/python/tests")
    [ -n "${FA_PYTEST_FILES:-}" ] && read -r -a targets <<<"$(printf "$PWD/python/tests/%s " $FA_PYTEST_FILES)"
    (cd /tmp && PYTHONUNBUFFERED=1 timeout "${FA_PYTEST_TIMEOUT:-240}" python3 -m pytest -q -rfEs -p no:cacheprovider \
      "${targets[@]}" >"$OUT/pytest_cuda.log" 2>&1)
    note "== pytest ${FA_PYTEST_FILES:-python/tests} (CUDA): exit $? in $(( $(date +%s) - start )) s: $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_cuda.log" | tail -1)"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -20 >>"$SUMMARY"
    grep -E "^SKIPPED" "$OUT/pytest_cuda.log" | cut -c1-160 >>"$SUMMARY"
  fi
  mkdir -p "$OUT/plots"
  if [[ "$parts" == *" cli "* ]]; then
    (cd /tmp && PYTHONUNBUFFERED=1 timeout "${FA_CLI_TIMEOUT:-150}" python3 -m flashattn.bench --dtype bf16 --head-dim 128 \
      --causal --mode fwd_bwd --seqlens 1024 2048 4096 8192 16384 32768 --json "$OUT/plots/bench_cli.json" \
      --plot-dir "$OUT/plots" >>"$OUT/python.log" 2>&1)
    note "== python -m flashattn.bench: exit $?"
  fi
  if [[ "$parts" == *" train "* ]]; then
    (cd /tmp && PYTHONUNBUFFERED=1 timeout "${FA_TRAIN_TIMEOUT:-200}" python3 "$OLDPWD/examples/train_gpt.py" --device cuda \
      --dtype bf16 --context 8192 --layers 4 --attn flashattn sdpa math --steps "${FA_TRAIN_STEPS:-150}" \
      --plot "$OUT/plots/train_gpt.png" --json "$OUT/plots/train_gpt.json" >>"$OUT/python.log" 2>&1)
    note "== examples/train_gpt.py (context 8192): exit $?"
    grep -E "peak|final|loss" "$OUT/python.log" | tail -8 >>"$SUMMARY"
  fi
fi

# Host cost of the Python op layer on CUDA tensors (wall, enqueue-only and GPU time; a cProfile).
if has_stage overhead; then
  if ! (cd /tmp && python3 -c "import flashattn" 2>/dev/null); then
    FLASHATTN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$JOBS timeout "${FA_PIP_TIMEOUT:-300}" \
      python3 -m pip install --no-build-isolation --no-deps --no-index -q ${FA_PIP_ARGS:-} . >"$OUT/overhead.log" 2>&1
  fi
  (cd /tmp && PYTHONUNBUFFERED=1 timeout 120 python3 "$OLDPWD/bench/gpu/op_overhead.py" >>"$OUT/overhead.log" 2>&1)
  note "== op overhead probe: exit $?"
  grep -E "wall\+sync|host cost|tottime|^ +[0-9]+ +[0-9.]+ +[0-9.]+" "$OUT/overhead.log" | head -30 >>"$SUMMARY"
fi

# At most 8 files come back: keep the summary, the table and the benchmark JSON; pack the rest.
keep=(summary.txt bench_table.txt bench_gpu.json bench_decode.json bench_gpu_fwd.json bench_fwd_table.txt
  bench_reference.txt bench_gpu_reference.json bench_variants.txt bench_variants.json decode_table.txt
  decode_fixed_cost.json read_floor.json bench_extras_ab.txt bench_extras_ab.json)
# (The archive is written outside $OUT: tar fails on a directory that changes as it reads it.)
(cd "$OUT" && tar czf /tmp/fa_logs.tar.gz "${keep[@]/#/--exclude=}" . && mv /tmp/fa_logs.tar.gz logs.tar.gz &&
  find . -mindepth 1 -maxdepth 1 ! -name logs.tar.gz $(printf ' ! -name %s' "${keep[@]}") -exec rm -rf {} +)

cat "$SUMMARY"
[ -f "$OUT/bench_table.txt" ] && cat "$OUT/bench_table.txt"
[ -f "$OUT/bench_fwd_table.txt" ] && cat "$OUT/bench_fwd_table.txt"
[ -f "$OUT/bench_reference.txt" ] && cat "$OUT/bench_reference.txt"
[ -f "$OUT/bench_variants.txt" ] && cat "$OUT/bench_variants.txt"
[ -f "$OUT/bench_extras_ab.txt" ] && cat "$OUT/bench_extras_ab.txt"
[ -f "$OUT/decode_table.txt" ] && tail -40 "$OUT/decode_table.txt"
exit 0

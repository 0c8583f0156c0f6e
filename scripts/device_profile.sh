#!/usr/bin/env bash
# One call on the GPU machine: a bf16 sm_90a build, then Nsight Compute on the kernels that
# miss their targets (decode split-KV, FA2 backward, Hopper forward). Reports go to $OUT (packed).
#
#   device tool: run(command="bash scripts/device_profile.sh", carry=["build-deps"])
#
# Environment knobs:
#   FA_PROFILE="decode bwd fwd"   which kernels to profile
#   FA_HEADDIMS="64;128"           head-dim classes to compile
#   FA_CMAKE_ARGS=""               extra CMake arguments (e.g. -DFLASHATTN_CUDA_DECODE=tiles)
#   FA_PROFILE_LIB=""              a library built earlier in the call (e.g. device_run.sh's build/): no build
#   FA_NCU_METRICS=""              more ncu metrics, comma-separated (e.g. sm__cycles_active.min,...max)
#   FA_DECODE_CASES="b64_32k b1_128k b8_128k b1_4k combine_b1_4k"   which decode shapes, each
#                                  [combine_|cudnn_]b<B>_<S>[k][_p<page>][_s<splits>] (see
#                                  profile_decode_case: e.g. b8_32k_p16_s2 is B = 8, 32k keys, paged 16,
#                                  two splits; b1_16 a 16-key call, the fixed cost; cudnn_b1_4k torch
#                                  SDPA's cuDNN call, every kernel of it)
#   FA_FWD_CASES="fwd128 fwd64"    which forward shapes (also fwd128_4k, fwd128_causal_4k)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fa_out}
mkdir -p "$OUT/ncu"
PROFILE=${FA_PROFILE:-"decode bwd fwd"}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $PROFILE " == *" $1 "* ]]; }
export FLASHATTN_LIB=${FA_PROFILE_LIB:-$PWD/build-profile/libflashattn.so}

note "== device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader), $(uname -r)"
start=$(date +%s)
if [ -n "${FA_PROFILE_LIB:-}" ]; then
  note "== no build: profiling $FA_PROFILE_LIB"
else
  cmake -S . -B build-profile -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BUILD_TESTS=OFF \
    -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_CUDA_HEADDIMS="${FA_HEADDIMS:-64;128}" -DFLASHATTN_CUDA_DTYPES=bf16 \
    -DFLASHATTN_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON \
    ${FA_CMAKE_ARGS:-} >"$OUT/ncu/build.log" 2>&1 && ninja -C build-profile -j "$(nproc)" flashattn >>"$OUT/ncu/build.log" 2>&1 ||
    { note "build FAILED"; grep -m20 -A5 error "$OUT/ncu/build.log"; exit 1; }
  note "== build: $(( $(date +%s) - start )) s"
fi

SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats)
profile() {  # profile NAME KERNEL_REGEX COMMAND...
  local name=$1 regex=$2
  shift 2
  # FA_NCU_LAUNCHES=all: every matching launch after the first call's (a call of several kernels).
  local launches=(--launch-skip 1 --launch-count 1)
  [[ ${FA_NCU_LAUNCHES:-} == all ]] && launches=()
  # FA_NCU_METRICS: more metrics, comma-separated (e.g. sm__cycles_active.min,sm__cycles_active.max: how
  # unevenly the SMs' blocks finish).
  local metrics=()
  [[ -n ${FA_NCU_METRICS:-} ]] && metrics=(--metrics "$FA_NCU_METRICS")
  timeout 150 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$regex" "${launches[@]}" \
    "${SECTIONS[@]}" "${metrics[@]}" "$@" >"$OUT/ncu/$name.txt" 2>&1
  note "== ncu $name: exit $? | $(grep -m1 -E 'Duration' "$OUT/ncu/$name.txt" | tr -s ' ') |$(grep -m1 -E 'DRAM Throughput' "$OUT/ncu/$name.txt" | tr -s ' ') |$(grep -m1 -E 'Compute \(SM\) Throughput' "$OUT/ncu/$name.txt" | tr -s ' ')"
}

# A decode case [combine_]b<B>_<S>[k][_p<page>][_s<splits>]: our split kernel (or, with combine_, the
# combine kernel) of a call with batch B and S keys (k: thousands of 1024), paged with that page size,
# with that split count (else the heuristic's). cudnn_b<B>_<S>[k]: every kernel of torch SDPA's cuDNN
# call on the same attention.
profile_decode_case() {
  local name=$1 pattern='^(combine_|cudnn_)?b([0-9]+)_([0-9]+)(k?)(_p([0-9]+))?(_s([0-9]+))?$'
  if ! [[ $name =~ $pattern ]]; then
    note "== decode case $name: expected [combine_|cudnn_]b<B>_<S>[k][_p<page>][_s<splits>]"
    return
  fi
  local kind=${BASH_REMATCH[1]} batch=${BASH_REMATCH[2]} cache=${BASH_REMATCH[3]}
  [[ -n ${BASH_REMATCH[4]} ]] && cache=$((cache * 1024))
  local args=(--batch "$batch" --cache "$cache")
  [[ -n ${BASH_REMATCH[6]} ]] && args+=(--paged "${BASH_REMATCH[6]}")
  [[ -n ${BASH_REMATCH[8]} ]] && args+=(--splits "${BASH_REMATCH[8]}")
  case $kind in
    combine_) profile "$name" combine python3 bench/gpu/profile_decode.py "${args[@]}" ;;
    cudnn_) FA_NCU_LAUNCHES=all profile "$name" '.*' python3 bench/gpu/profile_decode.py "${args[@]}" --sdpa cudnn ;;
    *) profile "decode_$name" split_kv python3 bench/gpu/profile_decode.py "${args[@]}" ;;
  esac
}
if has decode; then
  for case_name in ${FA_DECODE_CASES:-b64_32k b1_128k b8_128k b1_4k combine_b1_4k}; do
    profile_decode_case "$case_name"
  done
fi
if has bwd; then
  profile bwd128 'sm80::bwd_kernel' python3 bench/gpu/profile_bwd.py --dim 128
  profile bwd64 'sm80::bwd_kernel' python3 bench/gpu/profile_bwd.py --dim 64
fi
fwd_case() { [[ " ${FA_FWD_CASES:-fwd128 fwd64} " == *" $1 "* ]]; }
if has fwd; then
  fwd_case fwd128 && profile fwd128 'sm90::fwd_kernel' python3 bench/gpu/profile_bwd.py --dim 128
  fwd_case fwd64 && profile fwd64 'sm90::fwd_kernel' python3 bench/gpu/profile_bwd.py --dim 64
  fwd_case fwd128_4k && profile fwd128_4k 'sm90::fwd_kernel' python3 bench/gpu/profile_bwd.py --dim 128 --seqlen 4096
  fwd_case fwd128_causal_4k && profile fwd128_causal_4k 'sm90::fwd_kernel' \
    python3 bench/gpu/profile_bwd.py --dim 128 --seqlen 4096 --causal
fi
grep -E "registers|spill" "$OUT/ncu/build.log" | grep -B1 -E " [1-9][0-9]* bytes spill" | head -10 >>"$SUMMARY"

(cd "$OUT" && tar czf ncu.tar.gz ncu && rm -rf ncu)
cat "$SUMMARY"

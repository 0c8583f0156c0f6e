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
#   FA_DECODE_CASES="b64_32k b1_128k b8_128k b1_4k combine_b1_4k"   which decode shapes (also
#                                  b8_32k_s2, b8_32k_p16_s2: B = 8, 32k keys, two splits = one block per SM,
#                                  contiguous and paged 16; b1_16: B = 1, 16 keys, a call's fixed cost;
#                                  b64_4k; cudnn_b64_4k cudnn_b1_4k cudnn_b1_16: torch SDPA's cuDNN
#                                  kernel on the same attention, every kernel of the call)
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
  timeout 150 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$regex" "${launches[@]}" \
    "${SECTIONS[@]}" "$@" >"$OUT/ncu/$name.txt" 2>&1
  note "== ncu $name: exit $? | $(grep -m1 -E 'Duration' "$OUT/ncu/$name.txt" | tr -s ' ') |$(grep -m1 -E 'DRAM Throughput' "$OUT/ncu/$name.txt" | tr -s ' ') |$(grep -m1 -E 'Compute \(SM\) Throughput' "$OUT/ncu/$name.txt" | tr -s ' ')"
}

decode_case() { [[ " ${FA_DECODE_CASES:-b64_32k b1_128k b8_128k b1_4k combine_b1_4k} " == *" $1 "* ]]; }
if has decode; then
  decode_case b64_32k && profile decode_b64_32k split_kv python3 bench/gpu/profile_decode.py --batch 64 --cache 32768
  decode_case b1_128k && profile decode_b1_128k split_kv python3 bench/gpu/profile_decode.py --batch 1 --cache 131072
  decode_case b8_128k && profile decode_b8_128k split_kv python3 bench/gpu/profile_decode.py --batch 8 --cache 131072
  decode_case b1_4k && profile decode_b1_4k split_kv python3 bench/gpu/profile_decode.py --batch 1 --cache 4096
  decode_case combine_b1_4k && profile combine_b1_4k combine python3 bench/gpu/profile_decode.py --batch 1 --cache 4096
  decode_case b1_16 && profile decode_b1_16 split_kv python3 bench/gpu/profile_decode.py --batch 1 --cache 16
  decode_case b64_4k && profile decode_b64_4k split_kv python3 bench/gpu/profile_decode.py --batch 64 --cache 4096
  # cuDNN's call may run more than one kernel: every kernel of the second call is profiled.
  for shape in "64 4096" "1 4096" "1 16"; do
    set -- $shape
    name=cudnn_b$1_$(( $2 >= 1024 ? $2 / 1024 : $2 ))$( (( $2 >= 1024 )) && echo k)
    decode_case "$name" && FA_NCU_LAUNCHES=all profile "$name" '.*' python3 bench/gpu/profile_decode.py --batch "$1" \
      --cache "$2" --sdpa cudnn
  done
  decode_case b8_32k_s2 && profile decode_b8_32k_s2 split_kv python3 bench/gpu/profile_decode.py --batch 8 --cache 32768 --splits 2
  decode_case b8_32k_p16_s2 && profile decode_b8_32k_p16_s2 split_kv \
    python3 bench/gpu/profile_decode.py --batch 8 --cache 32768 --paged 16 --splits 2
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

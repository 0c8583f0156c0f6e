#!/usr/bin/env bash
# CI for the Python package: installs the build and test dependencies that are missing, builds and
# installs the package with `pip install ./` (timed), then runs pytest python/tests.
# Exits non-zero on any failure; pytest's "no tests collected" (exit 5) counts as a failure.
#   FLASHATTN_CUDA=AUTO|ON|OFF   passed to CMake (default AUTO: CUDA backend when nvcc is found)
#   FLASHATTN_PIP_ARGS           extra pip install arguments
#   PYTHON                       interpreter (default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}

# A C++ compiler, OpenMP and (if the system one is old) CMake come from the system setup script;
# CMake >= 3.24 and ninja can also come from PyPI.
command -v g++ >/dev/null || command -v c++ >/dev/null || bash "$root/scripts/setup.sh"

need=()
have() { "$py" -c "import $1" >/dev/null 2>&1; }
have scikit_build_core || need+=(scikit-build-core)
have nanobind || need+=(nanobind)
have pytest || need+=(pytest)
have numpy || need+=(numpy)
have torch || need+=(torch)
have transformers || need+=(transformers)
have matplotlib || need+=(matplotlib)
cmake_ok=$("$py" - <<'PY'
import re, shutil, subprocess
exe = shutil.which("cmake")
if not exe:
    print(0)
else:
    v = re.search(r"(\d+)\.(\d+)", subprocess.run([exe, "--version"], capture_output=True, text=True).stdout)
    print(int(bool(v) and (int(v[1]), int(v[2])) >= (3, 24)))
PY
)
[ "$cmake_ok" = 1 ] || need+=("cmake>=3.24")
command -v ninja >/dev/null || need+=(ninja)
if [ ${#need[@]} -gt 0 ]; then
  echo "== pip install ${need[*]}"
  "$py" -m pip install ${need[@]}
fi

echo "== pip install ./ (FLASHATTN_CUDA=${FLASHATTN_CUDA:-AUTO})"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$py" -m pip install --no-build-isolation ${FLASHATTN_PIP_ARGS:-} ./
end=$(date +%s)
echo "== install time: $((end - start)) s on $(nproc) cores"

echo "== pytest python/tests"
cd "$root"
set +e
"$py" -m pytest -ra python/tests
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit $rc

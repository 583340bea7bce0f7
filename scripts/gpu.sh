#!/usr/bin/env bash
# On the GPU machine (torch, triton and the CUDA toolkit installed; no network): build
# kiln, run the C++ tests, the Python tests (GPU ones included) and the benchmarks, and
# print a short table last. Header-only libraries missing there travel in .deps/include.
# Results go to $OUT (default bench/results/latest).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/bench/results/latest}
mkdir -p "$OUT"
jobs=$(nproc)
status=0
step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, 'triton', triton.__version__)"

step "optional packages"
# Pure-Python wheels the GPU machine lacks (diffusers, kernels, liger-kernel) travel in
# .deps/wheels, fetched with `pip download --no-deps`; tests and benches that need them skip
# where they are absent.
for wheel in .deps/wheels/*.whl; do
  [ -e "$wheel" ] || continue
  python3 -m pip install --root-user-action=ignore --no-index --no-deps -q "$wheel" \
    && echo "installed $(basename "$wheel")" || echo "could not install $(basename "$wheel")"
done

step "build and install"
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

step "C++ tests"
if [ "${SKIP_CPP:-0}" = 1 ]; then
  echo "skipped (SKIP_CPP=1)"
else
  cmake -S . -B build/gpu -G Ninja -DKILN_BUILD_TORCH=OFF >/dev/null \
    && cmake --build build/gpu -j "$jobs" >"$OUT/cpp-build.log" 2>&1 \
    && ctest --test-dir build/gpu --output-on-failure >"$OUT/ctest.log" 2>&1 || status=1
  tail -4 "$OUT/ctest.log"
fi

step "Python tests (GPU included)"
# PYTEST_ARGS narrows the run (e.g. "test_swiglu_cuda.py -k bf16"); SKIP_CPP=1 skips ctest.
# The suite runs in PYTEST_WORKERS processes (default: one per core; 0 = serially) where
# pytest-xdist is installed: serially it takes about 20 minutes on an H200 machine, most of it
# the full tunes of the norm variant tests, which compile on the CPU. Those tests take 20-40 s
# each, so idle workers steal queued tests rather than wait on a fixed share: 16 workers ran
# the suite in 6 minutes. Each worker has a kiln cache of its own (conftest.py), and no test
# times anything.
workers=""
if python3 -c "import xdist" 2>/dev/null && [ "${PYTEST_WORKERS:-$jobs}" != 0 ]; then
  workers="-n ${PYTEST_WORKERS:-$jobs} --dist worksteal"
fi
(cd tests/python && python3 -m pytest -q -p no:cacheprovider --maxfail=20 -rf $workers \
  ${PYTEST_ARGS:-.} 2>&1 | tee "$OUT/pytest.log" | tail -45) || status=1
grep -E "passed|failed" "$OUT/pytest.log" | tail -1 | grep -q failed && status=1

step "Python tests under a newer transformers"
# Models the GPU machine's transformers lacks (Inkling 2; MiniMax-M3-VL's later RoPE) travel as
# a newer transformers wheel in .deps/transformers (`pip download --no-deps transformers==X`),
# installed into a folder of its own for the tests of those models only.
newer=$(ls .deps/transformers/transformers-*.whl 2>/dev/null | head -1)
if [ -n "$newer" ]; then
  rm -rf /tmp/kiln-newer-transformers
  python3 -m pip install --root-user-action=ignore --no-index --no-deps -q \
    --target /tmp/kiln-newer-transformers "$newer" || status=1
  (cd tests/python && PYTHONPATH=/tmp/kiln-newer-transformers python3 -m pytest -q -p no:cacheprovider -rf \
    -k "inkling2 or minimax_m3_vl" test_prewarm_cuda.py test_prewarm.py test_patch_vision_cpu.py \
    test_patch_vision_cuda.py test_e2e_bench_cpu.py 2>&1 | tee "$OUT/pytest-newer-transformers.log" | tail -8) \
    || status=1
  grep -E "passed|failed" "$OUT/pytest-newer-transformers.log" | tail -1 | grep -q failed && status=1
else
  echo "skipped (no wheel in .deps/transformers)"
fi

step "main job"
python3 examples/quickstart.py || status=1

step "benchmarks"
# BENCHES lists the bench/ scripts to run (default: all of them), e.g. "rms_norm swiglu";
# "none" runs none.
benches=${BENCHES:-$(ls bench/*.py | xargs -n1 basename | sed 's/\.py$//' | grep -v '^common$')}
[ "$benches" = none ] && benches=""
for bench in $benches; do
  python3 "bench/$bench.py" --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-$bench.log" \
    | tail -24 || status=1
done
exit $status

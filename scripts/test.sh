#!/usr/bin/env bash
# kiln's test command: set-up (scripts/setup.sh), then the C++ unit tests (doctest), the
# PTX FileCheck tests and the Python tests. GPU tests run where a GPU is, and are skipped
# with a reason elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON=${PYTHON:-python3}

echo "test: C++ unit tests and PTX FileCheck tests"
cmake -S . -B build/tests -G Ninja -DKILN_BUILD_TORCH=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/tests -j "$(nproc)"
ctest --test-dir build/tests --output-on-failure

echo "test: Python tests"
# Run from outside the source tree so `import kiln` is the installed package.
cd tests/python
"$PYTHON" -m pytest -q -p no:cacheprovider "$@" .

#!/usr/bin/env bash
# kiln's main job: set-up, then JIT-compile and tune RMSNorm for the GPU found, check it
# against PyTorch and print time, bandwidth and the chosen config. With no GPU it says so
# and compiles RMSNorm for sm_75, sm_80 and sm_90 instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" examples/quickstart.py "$@"

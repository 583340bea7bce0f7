#!/usr/bin/env bash
# Installs what kiln needs on a fresh Debian/Ubuntu machine (compiler, CMake, header-only
# libraries, FileCheck, the Python packages) and builds and installs kiln itself.
# Idempotent: what is already there is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for pkg in g++ cmake ninja-build nlohmann-json3-dev libxxhash-dev doctest-dev libcli11-dev llvm-14-tools; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A headless browser for the report's rendering test (skipped without it); optional, so a
# distribution that packages chromium only as a snap still sets up.
if ! command -v chromium >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null 2>&1 ||
    echo "setup: chromium not installed; the report's browser test will be skipped"
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, pytest, scikit_build_core, numpy, transformers, accelerate, diffusers, peft" >/dev/null 2>&1; then
  echo "setup: installing Python packages (scripts/requirements.txt)"
  "$PYTHON" -m pip install -q -r scripts/requirements.txt
fi

echo "setup: building and installing kiln"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps .

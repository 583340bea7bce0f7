#!/usr/bin/env bash
# Builds and runs the diagnostics (needs nvcc and a GPU): flush_alternation (why the tuner
# times in interleaved rounds), stream_shapes (how a streaming kernel's work shape sets its
# bandwidth), launch_params (how a kernel's parameter bytes set a launch-bound call's time),
# rope_table (what reading a cos/sin table costs a RoPE kernel), dependent_launch (what
# programmatic dependent launch saves between small kernels in a CUDA graph; sm_90) and
# one_row (where a launch-bound norm's time goes, parameter bytes included, with norm_ladder's
# steps from a minimal norm kernel towards kiln's).
# Usage: bash bench/diagnostics/run.sh
set -euo pipefail
cd "$(dirname "$0")"
build=$(mktemp -d)
nvcc -O3 -arch=native -cubin -o "$build/kernels.cubin" kernels.cu
g++ -O2 -std=c++17 flush_alternation.cpp -I/usr/local/cuda/include \
  -L/usr/local/cuda/lib64/stubs -lcuda -o "$build/flush_alternation"
for rows in 1 128; do "$build/flush_alternation" "$build/kernels.cubin" "$rows"; done
nvcc -O3 -std=c++17 -arch=native -o "$build/stream_shapes" stream_shapes.cu
"$build/stream_shapes"
nvcc -O3 -std=c++17 -arch=native -o "$build/launch_params" launch_params.cu
"$build/launch_params"
nvcc -O3 -std=c++17 -arch=native -o "$build/rope_table" rope_table.cu
"$build/rope_table"
nvcc -O3 -std=c++17 -arch=native -o "$build/dependent_launch" dependent_launch.cu
"$build/dependent_launch"
nvcc -O3 -std=c++17 -arch=native -I../../templates -o "$build/one_row" one_row.cu -lcuda
nvcc -O3 -std=c++17 -arch=native -I../../templates -ptx -o "$build/norm_ladder.ptx" norm_ladder.cu
ladder=()
for step in base unchecked checked strided clamped looped barrier2; do
  ladder+=("$build/norm_ladder.ptx" "${step}512" 512 "$build/norm_ladder.ptx" "${step}256" 256)
done
"$build/one_row" "${ladder[@]}"

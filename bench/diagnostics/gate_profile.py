"""GPT-OSS's expert gate at decode sizes (4 and 128 routed rows of 2880) for `ncu`: kiln's
clamped_swiglu, torch.compile of transformers' formula and kiln's packed swiglu of the same
bytes, each called once between cudaProfilerStart and Stop after warm-up calls that fill kiln's
cache and compile Inductor's kernel, so a profiler that starts there sees one launch of each.

Usage (on the GPU machine):
  python bench/diagnostics/gate_profile.py            # warm kiln's cache
  ncu --profile-from-start off --clock-control none --cache-control all \\
      --section SpeedOfLight --section LaunchStats --section WarpStateStats \\
      --section InstructionStats --section SchedulerStats \\
      python bench/diagnostics/gate_profile.py"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import activations  # noqa: E402
from profiled_calls import profile_once  # noqa: E402

import kiln  # noqa: E402


def calls():
    compiled = torch.compile(activations.eager_clamped_swiglu, dynamic=False)
    for rows in (4, 128):
        p = torch.randn(rows, 2 * 2880, device="cuda", dtype=torch.bfloat16) * 7
        yield f"kiln clamped_swiglu {rows}x2880", lambda p=p: kiln.clamped_swiglu(p)
        yield f"torch.compile {rows}x2880", lambda p=p: compiled(p)
        yield f"kiln swiglu packed {rows}x2880", lambda p=p: kiln.swiglu(p)


if __name__ == "__main__":
    profile_once(calls(), warmups=3)

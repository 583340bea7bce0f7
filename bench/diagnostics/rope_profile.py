"""The RoPE calls under 128 MB (and the 176 MB table call) beside PyTorch's copy and negation
of the same q and k, for `ncu`: each is called once between cudaProfilerStart and Stop, after
a warm-up call that fills kiln's cache (tunes included), so a profiler that starts there sees
one launch of each and nothing of the tuning.

Usage (on the GPU machine):
  python bench/diagnostics/rope_profile.py            # warm kiln's cache
  ncu --profile-from-start off --clock-control none --cache-control all \\
      --section SpeedOfLight --section Occupancy --section WarpStateStats \\
      python bench/diagnostics/rope_profile.py"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import rope as rope_bench  # noqa: E402
from profiled_calls import profile_once  # noqa: E402

import kiln  # noqa: E402

BF16 = torch.bfloat16


def calls():
    grid = (7, 16, 24)
    s = grid[0] * grid[1] * grid[2]
    q = torch.randn(1, 32, 4096, 128, device="cuda", dtype=BF16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=BF16)
    cos, sin = rope_bench.llama_table(1, 4096, 128)
    yield "prefill 86 MB", lambda: kiln.rope(q, k, cos, sin)
    fq = torch.randn(1, 24, 4608, 128, device="cuda", dtype=BF16)
    fk = torch.randn(1, 24, 4608, 128, device="cuda", dtype=BF16)
    fcos, fsin = torch.randn(4608, 128, device="cuda"), torch.randn(4608, 128, device="cuda")
    yield "flux 118 MB", lambda: kiln.rope(fq, fk, fcos, fsin, interleaved=True)
    lq = torch.randn(2, s, 2048, device="cuda", dtype=BF16)
    lk = torch.randn(2, s, 2048, device="cuda", dtype=BF16)
    lcos, lsin = rope_bench.ltx_table(2, 2048, *grid)
    scale = (0.32, 32, 32)
    yield "rope_3d 88 MB", lambda: kiln.rope_3d(lq, lk, *grid, scale)
    wq = torch.randn(2048, device="cuda", dtype=BF16)
    wk = torch.randn(2048, device="cuda", dtype=BF16)
    yield "rms_norm_rope coords 88 MB", lambda: kiln.rms_norm_rope(
        lq, lk, wq, wk, 1e-5, grid=grid, rope_interpolation_scale=scale)
    yield "ltx table 176 MB", lambda: kiln.rope(lq, lk, lcos, lsin, interleaved=True, layout="bshd")
    both = torch.cat([lq.flatten(), lk.flatten()])
    out = torch.empty_like(both)
    yield "copy 88 MB", lambda: out.copy_(both)
    yield "neg 88 MB", lambda: torch.neg(both, out=out)


if __name__ == "__main__":
    profile_once(calls())

"""The vision towers' RoPE calls (bench/vision_rope.py) as kiln.patch runs them and as
torch.compile runs transformers' function, beside PyTorch's copy and negation of the same q and
k, each launched once for `ncu` (profiled_calls.py). With TORCH_LOGS=output_code the warm-up
prints Inductor's kernels.

Usage (on the GPU machine):
  python bench/diagnostics/vision_rope_profile.py            # warm kiln's cache
  ncu --profile-from-start off --clock-control none --cache-control all \\
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \\
      python bench/diagnostics/vision_rope_profile.py"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import vision_rope as bench  # noqa: E402
from profiled_calls import profile_once  # noqa: E402

BF16 = torch.bfloat16


def calls():
    from kiln.patching.vision_rope import compare, vision_rope

    for name, patches, head_dim, model in (("Qwen3-VL 72", 4096, 72, "qwen2_5_vl"),
                                           ("Qwen2.5-VL 80", 5184, 80, "qwen2_5_vl"),
                                           ("MiniMax-M3-VL 78 of 80", 5184, 80, "minimax_m3_vl")):
        apply = bench.vision_apply(model)
        form, text = compare(apply)
        if form is None:
            print(f"{name}: skipped ({text})")
            continue
        patched = vision_rope(apply, form)
        compiled = torch.compile(apply, dynamic=False)
        if model == "minimax_m3_vl":
            q, k = bench.separate_qk(patches, head_dim)
            cos, sin = bench.table(patches, head_dim, rotated=bench.MINIMAX_ROTATED, dtype=BF16)
        else:
            q, k = bench.packed_qk(patches, head_dim)
            cos, sin = bench.table(patches, head_dim)
        yield f"{name} kiln", lambda f=patched, q=q, k=k, c=cos, s=sin: f(q, k, c, s)
        yield f"{name} compiled", lambda f=compiled, q=q, k=k, c=cos, s=sin: f(q, k, c, s)
        both = torch.cat([q.flatten(), k.flatten()])
        out = torch.empty_like(both)
        yield f"{name} copy", lambda o=out, b=both: o.copy_(b)
        yield f"{name} neg", lambda o=out, b=both: torch.neg(b, out=o)


if __name__ == "__main__":
    profile_once(calls(), warmups=3)

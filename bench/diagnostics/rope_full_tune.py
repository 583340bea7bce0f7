"""A full tune (every config timed) of kiln.rope on the Llama prefill in both memory layouts
of q and k: contiguous [B, H, S, D], and [B, S, H, D] memory viewed as [B, H, S, D] (how
transformers' attention hands them to apply_rotary_pos_emb); then the tuned call beside
Liger-Kernel's in-place rotation (where installed) and a copy of the same bytes.

Usage: python bench/diagnostics/rope_full_tune.py   (GPU; prints the tuning report last)"""

import os
import sys

os.environ["KILN_TUNE"] = "full"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import libraries  # noqa: E402
import rope as rope_bench  # noqa: E402

kiln = common.fresh_kiln()
b, hq, hk, s, d = 1, 32, 8, 4096, 128
cos, sin = rope_bench.llama_table(b, s, d)
moved = 2 * (b * s * (hq + hk) * d) * 2 + 2 * cos.numel() * 2
layouts = {
    "bhsd": (libraries.rand(b, hq, s, d), libraries.rand(b, hk, s, d)),
    "bshd memory": (libraries.rand(b, s, hq, d).transpose(1, 2), libraries.rand(b, s, hk, d).transpose(1, 2)),
}
for name, (q, k) in layouts.items():
    kiln.rope(q, k, cos, sin)
    contenders = {"kiln": lambda q=q, k=k: kiln.rope(q, k, cos, sin),
                  "copy": common.same_bytes_copy(moved)}
    if libraries.LIGER is not None:
        own = (q.clone(), k.clone())
        contenders["liger"] = lambda own=own: libraries.LIGER["rope"](*own, cos, sin)
    times = common.bench_side_by_side(contenders)
    print(name, ", ".join(f"{k} {v * 1e3:.2f} us" for k, v in times.items()), flush=True)
print(kiln.report(format="md", op="rope"))

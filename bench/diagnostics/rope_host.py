"""Host time of one RoPE call at decode size, beside `x.add(x)` (the host-overhead target of
TARGETS.md) and kiln.rms_norm: each contender called back to back, 200 calls a block, blocks
interleaved over rounds, the median block taken (bench/common.host_side_by_side). The kernels
take about 5 us; a call that costs the host more than that is what a decode loop without
CUDA graphs waits on.

Usage: python bench/diagnostics/rope_host.py [--out DIR] [--tag TAG]"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
from rope import llama_table  # noqa: E402


def contenders(kiln):
    bf16 = torch.bfloat16
    # One decode token of a Llama-3-8B / Qwen3-8B attention: 32 + 8 heads of 128.
    q_raw = torch.randn(1, 1, 32, 128, device="cuda", dtype=bf16)  # [B, S, H, D], as projected
    k_raw = torch.randn(1, 1, 8, 128, device="cuda", dtype=bf16)
    q, k = q_raw.transpose(1, 2), k_raw.transpose(1, 2)  # transformers' [B, H, S, D] views
    qc, kc = q.contiguous(), k.contiguous()
    w = torch.ones(128, device="cuda", dtype=bf16)
    cos, sin = llama_table(1, 1, 128)
    fp32_cos, fp32_sin = cos.float()[0], sin.float()[0]
    x = torch.randn(8192, device="cuda", dtype=bf16)
    ops = torch.ops.kiln
    return {
        "x.add(x)": lambda: x.add(x),
        "kiln.rms_norm": lambda: kiln.rms_norm(qc, w, 1e-6),
        "kiln.rope (transformers' views)": lambda: kiln.rope(q, k, cos, sin),
        "kiln.rope (contiguous)": lambda: kiln.rope(qc, kc, cos, sin),
        "kiln.rope (bshd, fp32 table)": lambda: kiln.rope(q_raw, k_raw, fp32_cos, fp32_sin,
                                                          interleaved=True, layout="bshd"),
        "kiln.rope_": lambda: kiln.rope_(qc, kc, cos, sin),
        "kiln.head_norm_rope": lambda: kiln.head_norm_rope(q, k, w, w, cos, sin),
        "torch.ops.kiln.rope_backward": lambda: ops.rope_backward.default(qc, kc, cos, sin),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="appended to the file name")
    args = parser.parse_args()
    kiln = common.fresh_kiln()
    env = common.environment()
    fns = contenders(kiln)
    with torch.no_grad():
        for fn in fns.values():
            fn()  # compile and tune outside the timing
        torch.cuda.synchronize()
        host = common.host_side_by_side(fns)
    lines = [f"Host time per call, us (decode: q [1, 32, 1, 128], k [1, 8, 1, 128], bf16), "
             f"{env['device']}, {env['date']}, torch {env['versions']['torch']}", "",
             "| call | host us | / x.add(x) |", "| --- | --- | --- |"]
    for name, us in host.items():
        lines.append(f"| {name} | {us:.1f} | {us / host['x.add(x)']:.2f} |")
    table = "\n".join(lines)
    common.write_diagnostics(args.out, "rope-host", env, args.tag, table)


if __name__ == "__main__":
    main()

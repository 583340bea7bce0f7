"""The activation of diffusers' gated feed-forwards alone, GPU time: the packed projection
[tokens, 2 x inner] (up first, as GEGLU and SwiGLU chunk it) through diffusers' formula
(`h * F.gelu(gate)`, erf form, or `h * F.silu(gate)`), its torch.compile, kiln.geglu / kiln.swiglu
with up_first, and a copy of the same bytes, timed side by side (bench/common.bench_side_by_side:
CUDA events, L2 flushed before each call, interleaved rounds). The shapes are
bench/gated_feed_forward.py's.

Usage: python bench/diagnostics/packed_gate_kernels.py [--out DIR] [--tag TAG]"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402

# (name, activation, tokens, inner)
SHAPES = [("SD 1.5 level 1", "geglu", 8192, 1280), ("SDXL level 1", "geglu", 8192, 2560),
          ("SDXL level 2", "geglu", 2048, 5120), ("Mochi", "swiglu", 8192, 8192)]


def formula(activation):
    def geglu(packed):
        h, gate = packed.chunk(2, dim=-1)
        return h * F.gelu(gate)

    def swiglu(packed):
        h, gate = packed.chunk(2, dim=-1)
        return h * F.silu(gate)

    return geglu if activation == "geglu" else swiglu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="appended to the file name")
    args = parser.parse_args()
    kiln = common.fresh_kiln()
    env = common.environment()
    lines = [f"Packed gated activations, GPU time per call, us (L2 flushed), {env['device']}, {env['date']}, "
             f"torch {env['versions']['torch']}", "",
             "| shape | activation | packed | eager | torch.compile | kiln | copy of same MB | kiln vs best peer | "
             "kiln % of copy's time |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, activation, tokens, inner in SHAPES:
        packed = torch.randn(tokens, 2 * inner, device="cuda", dtype=torch.bfloat16)
        eager = formula(activation)
        compiled = torch.compile(eager, dynamic=False)
        if activation == "geglu":
            ours = lambda: kiln.geglu(packed, None, "none", True)  # noqa: E731
        else:
            ours = lambda: kiln.swiglu(packed, None, True)  # noqa: E731
        expected = eager(packed.double())
        got = ours()
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        copy = common.same_bytes_copy(packed.numel() * 2 + tokens * inner * 2)
        ms = common.bench_side_by_side({"eager": lambda: eager(packed), "compile": lambda: compiled(packed),
                                        "kiln": ours, "copy": copy})
        us = {k: v * 1e3 for k, v in ms.items()}
        best = min(us["eager"], us["compile"])
        moved = (packed.numel() + tokens * inner) * 2 / 1e6
        lines.append(f"| {name} ({tokens}x{2 * inner}) | {activation} | {moved:.0f} MB | {us['eager']:.1f} | "
                     f"{us['compile']:.1f} | {us['kiln']:.1f} | {us['copy']:.1f} | {best / us['kiln']:.2f}x | "
                     f"{100 * us['copy'] / us['kiln']:.0f}% (max rel err {error:.1e}) |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    common.write_diagnostics(args.out, "packed-gate-kernels", env, args.tag, table)


if __name__ == "__main__":
    main()

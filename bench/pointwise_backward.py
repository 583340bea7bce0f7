"""Backward passes of RoPE and the activations: kiln's backward ops beside torch autograd of
the eager formula and of torch.compile of it (dynamic=False), bf16; plus kiln's op through
the autograd engine (what loss.backward() runs). Each backward is timed alone: the forward
graph is built once and torch.autograd.grad(..., retain_graph=True) is timed. Bytes count
every tensor the gradient must read (inputs, dy, tables) and write (the gradients) once.

Usage: python bench/pointwise_backward.py [--out DIR] [--quick] [--only TEXT] [--tag TAG]
(--only: the cases whose name holds TEXT, e.g. "clamped" for GPT-OSS's expert gate.)
Writes DIR/pointwise_backward-<date>-<device><TAG>.json and .md; prints the table last."""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16
TOKENS = [128, 4096, 16384]
QUICK_TOKENS = [128, 4096]
WIDTHS = [8192, 14336]


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def hf_rope(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (cos/sin [B, S, D], unsqueezed at the heads)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def diffusers_rope(q, k, cos, sin):
    """diffusers' apply_rotary_emb(use_real_unbind_dim=-1) on q and k [B, H, S, D]."""
    def one(x):
        re, im = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-im, re], dim=-1).flatten(3)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
    return one(q), one(k)


# GPT-OSS's routed rows (four experts a token) at 1024 and 4096 tokens, its experts' width.
GPT_OSS_ROWS = [4096, 16384]
GPT_OSS_WIDTH = 2880


def gpt_oss_gate(p, alpha=1.702, limit=7.0):
    """GPT-OSS's expert gate as transformers writes it (GptOssExperts._apply_gate)."""
    gate, up = p[..., ::2], p[..., 1::2]
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def cases(quick):
    """(name, bytes, eager forward, kiln forward, kiln backward call, inputs, dy)."""
    import kiln

    def r(*shape, grad=True):
        return torch.randn(shape, device="cuda", dtype=BF16).requires_grad_(grad)

    for tokens in QUICK_TOKENS if quick else TOKENS:
        for width in WIDTHS:
            n = tokens * width * 2
            g, u, dy = r(tokens, width), r(tokens, width), r(tokens, width, grad=False)
            yield (f"swiglu {tokens}x{width}", 5 * n, lambda g, u: F.silu(g) * u, kiln.swiglu,
                   lambda g=g, u=u, dy=dy: torch.ops.kiln.swiglu_backward(dy, g, u), (g, u), dy)
            p = r(tokens, 2 * width)
            yield (f"swiglu packed {tokens}x{width}", 5 * n,
                   lambda p: F.silu(p[..., :p.shape[-1] // 2]) * p[..., p.shape[-1] // 2:],
                   kiln.swiglu, lambda p=p, dy=dy: torch.ops.kiln.swiglu_backward(dy, p), (p,), dy)
            yield (f"geglu tanh {tokens}x{width}", 5 * n,
                   lambda g, u: F.gelu(g, approximate="tanh") * u, kiln.geglu,
                   lambda g=g, u=u, dy=dy: torch.ops.kiln.geglu_backward(dy, g, u), (g, u), dy)
            b = r(width)
            yield (f"gelu tanh + bias {tokens}x{width}", 3 * n + 2 * width * 2,
                   lambda x, b: F.gelu(x + b, approximate="tanh"),
                   lambda x, b: kiln.gelu(x, b, approximate="tanh"),
                   lambda g=g, b=b, dy=dy: torch.ops.kiln.gelu_backward(dy, g, b), (g, b), dy)

    for rows in GPT_OSS_ROWS[:1] if quick else GPT_OSS_ROWS:
        n = rows * GPT_OSS_WIDTH * 2
        # Values across the clamps at +-7, as GPT-OSS's routed projections reach.
        p = (torch.randn(rows, 2 * GPT_OSS_WIDTH, device="cuda") * 7).to(BF16).requires_grad_()
        dy = r(rows, GPT_OSS_WIDTH, grad=False)
        yield (f"clamped_swiglu (GPT-OSS) {rows}x{GPT_OSS_WIDTH}", 5 * n, gpt_oss_gate, kiln.clamped_swiglu,
               lambda p=p, dy=dy: (torch.ops.kiln.clamped_swiglu_backward(dy, p, 1.702, 7.0, True),), (p,), dy)

    for batch, seq in ([(1, 4096)] if quick else [(1, 4096), (8, 2048)]):
        q, k = r(batch, 32, seq, 128), r(batch, 8, seq, 128)
        inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        emb = torch.cat([torch.arange(seq, device="cuda").float()[:, None] * inv] * 2, -1)
        cos, sin = emb.cos().to(BF16).expand(batch, -1, -1), emb.sin().to(BF16).expand(batch, -1, -1)
        dq, dk = torch.randn_like(q), torch.randn_like(k)
        yield (f"rope half (Llama) q[{batch},32,{seq},128] k 8 heads",
               2 * 2 * (q.numel() + k.numel()) + 2 * seq * 128 * 2,
               lambda q, k: hf_rope(q, k, cos, sin), lambda q, k: kiln.rope(q, k, cos, sin),
               lambda q=q, k=k, dq=dq, dk=dk, c=cos, s=sin: torch.ops.kiln.rope_backward(dq, dk, c, s),
               (q, k), (dq, dk))
    q, k = r(1, 24, 4608, 128), r(1, 24, 4608, 128)
    angles = torch.rand(4608, 64, device="cuda") * 6
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    yield ("rope interleaved (FLUX-like) q,k [1,24,4608,128], fp32 table",
           2 * 2 * 2 * q.numel() + 2 * cos.numel() * 4,
           lambda q, k: diffusers_rope(q, k, cos, sin),
           lambda q, k: kiln.rope(q, k, cos, sin, interleaved=True),
           lambda q=q, k=k, dq=dq, dk=dk: torch.ops.kiln.rope_backward(dq, dk, cos, sin, True),
           (q, k), (dq, dk))


def grad_timer(fn, inputs, dy):
    """Times the backward of fn(*inputs) alone: the graph is built once and kept."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    dys = dy if isinstance(dy, tuple) else (dy,)
    return lambda: torch.autograd.grad(outs, inputs, dys, retain_graph=True)


def max_rel_err(got, inputs, eager, dy):
    """kiln's backward op against fp64 autograd of the eager formula."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    out = eager(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    dys = dy if isinstance(dy, tuple) else (dy,)
    want = torch.autograd.grad(outs, leaves, [d.double() for d in dys])
    return max(((g.double() - w).abs() / w.abs().clamp_min(1)).max().item()
               for g, w in zip(got, want))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a subset of the shapes")
    parser.add_argument("--only", default="", help="only the cases whose name holds this text")
    parser.add_argument("--tag", default="", help="appended to the output file names")
    args = parser.parse_args()
    kiln = common.fresh_kiln(256)
    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    rows = []
    for name, moved, eager, kiln_forward, kiln_backward, inputs, dy in cases(args.quick):
        if args.only not in name:
            continue
        got = kiln_backward()  # compile + tune outside the timing
        compiled = torch.compile(eager, dynamic=False)
        calls = {"kiln": kiln_backward,
                 "kiln via autograd": grad_timer(kiln_forward, inputs, dy),
                 "eager autograd": grad_timer(eager, inputs, dy),
                 "compiled autograd": grad_timer(compiled, inputs, dy)}
        times = common.bench_side_by_side(calls)
        best_peer = min(times["eager autograd"], times["compiled autograd"])
        rows.append({
            "case": name, "bytes": moved,
            "us": {k: v * 1e3 for k, v in times.items()},
            "pct_of_copy": {k: 100 * moved / (v * 1e-3) / 1e9 / copy_gbs for k, v in times.items()},
            "speedup_vs_best_peer": best_peer / times["kiln"],
            "max_rel_err_vs_fp64": max_rel_err(got, inputs, eager, dy),
        })
        print(name, ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in times.items()), flush=True)
        del calls, got
    geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in rows) / len(rows))
    result = {"environment": env, "copy_gbs": copy_gbs, "backward_bf16": rows,
              "geomean_speedup_vs_best_peer": geomean, "kiln_settings": kiln.settings()}
    stamp = common.stamp(env)
    common.write_json(os.path.join(args.out, f"pointwise_backward-{stamp}{args.tag}.json"), result)
    lines = [
        f"Backward of RoPE and the activations, bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}, triton {env['versions'].get('triton', '-')}; "
        f"copy {copy_gbs:.0f} GB/s",
        "",
        "| case | MB | kiln us (% copy) | kiln via autograd us | eager autograd us "
        "| compiled autograd us (% copy) | kiln vs best | max rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us['kiln via autograd']:.1f} | {us['eager autograd']:.1f} "
                     f"| {us['compiled autograd']:.1f} ({pct['compiled autograd']:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['max_rel_err_vs_fp64']:.1e} |")
    lines += ["", f"Geometric mean of kiln vs the best peer: {geomean:.2f}x"]
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"pointwise_backward-{stamp}{args.tag}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

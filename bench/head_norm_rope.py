"""The per-head q/k RMSNorm + RoPE prologue of Qwen3 (Gemma 3 and OLMo-style models alike),
FLUX and Qwen3-Next (a partial rotation): kiln.head_norm_rope (one launch, q and k read and
written once) beside the eager prologue (the models' norm modules, then transformers'
``apply_rotary_pos_emb`` or diffusers' ``apply_rotary_emb``), torch.compile of it, and kiln's
two-step path (``kiln.rms_norm`` on q and on k, then ``kiln.rope``: what a patched model ran
before the fusion), bf16, with a copy of the same bytes in the same rounds. Bytes: q and k read
and written once, the table and the weights once. Decode shapes are also timed as a model
without CUDA graphs calls them, back to back on the host.

Usage: python bench/head_norm_rope.py [--out DIR] [--quick]
Writes DIR/head_norm_rope-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from rope import hf_apply, llama_table, rel_err  # noqa: E402

BF16 = torch.bfloat16


def qwen3_rms_norm(weight, eps=1e-6):
    """transformers' Qwen3RMSNorm.forward, restated: fp32 math, rounded to the input dtype
    before the weight multiply."""
    def norm(x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)
    return norm


def diffusers_rms_norm(weight, eps=1e-6):
    """diffusers' RMSNorm(head_dim, elementwise_affine=True).forward, restated."""
    def norm(x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        y = x * torch.rsqrt(variance + eps)
        return y.to(weight.dtype) * weight
    return norm


def gemma_rms_norm(weight, eps=1e-6):
    """transformers' Qwen3NextRMSNorm.forward (Gemma's rule), restated: fp32 math, times
    1 + weight, rounded once."""
    def norm(x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * (1.0 + weight.float())).type_as(x)
    return norm


def flux_apply_rotary_emb(x, cos, sin):
    """diffusers' apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=-1, sequence_dim=1) on
    [B, S, H, D] with cos/sin [S, D]."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def partial_apply():
    """transformers' Qwen3-Next apply_rotary_pos_emb (the first cos.shape[-1] columns of each
    head rotated, the rest passed through), or a restatement of it where the import fails."""
    try:
        from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb
        return apply_rotary_pos_emb, "transformers"
    except ImportError:
        apply, _ = hf_apply()

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            r = cos.shape[-1]
            q_rot, k_rot = apply(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim)
            return torch.cat([q_rot, q[..., r:]], -1), torch.cat([k_rot, k[..., r:]], -1)
        return apply_rotary_pos_emb, "local copy"


def transformers_case(name, kind, q, k, wq, wk, norms, apply, source, cos, sin):
    """One case of a transformers attention's prologue: q and k its projections' [B, S, H, D]
    views, normalised by `norms` (the modules' forwards, restated), transposed to [B, H, S, D]
    views and rotated by `apply`; kiln's calls take the norms' [D] weights `wq` and `wk`."""
    import kiln

    nq, nk = norms

    def prologue(q, k, cos, sin):
        return apply(nq(q).transpose(1, 2), nk(k).transpose(1, 2), cos, sin)

    def fused():
        return kiln.head_norm_rope(q.transpose(1, 2), k.transpose(1, 2), wq, wk, cos, sin)

    compiled = torch.compile(prologue, dynamic=False)
    args = (q, k, cos, sin)
    return {
        "name": name,
        "bytes": 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 2 + 2 * wq.numel() * 2,
        "decode": kind == "decode",
        "kiln": fused,
        "kiln two-step": lambda: kiln.rope(kiln.rms_norm(q, wq, 1e-6).transpose(1, 2),
                                           kiln.rms_norm(k, wk, 1e-6).transpose(1, 2), cos, sin),
        "peers": {f"eager ({source})": lambda: prologue(*args), "compiled": lambda: compiled(*args)},
        "check": lambda: rel_err(fused()[0], prologue(*args)[0]),
    }


def qwen3_next_cases(quick):
    """Qwen3-Next-80B-A3B's full-attention prologue: 16 q heads and 2 kv heads of 256, Gemma's
    1 + weight norms, the first 64 columns rotated (partial_rotary_factor 0.25). q is the first
    half of each head's [q, gate] pair of the projection, a strided view, as the model chunks it."""
    apply_partial, source = partial_apply()
    shapes = [(1, 4096, "prefill"), (64, 1, "decode")]
    for b, s, kind in (shapes[:1] if quick else shapes):
        q = torch.randn(b, s, 16, 512, device="cuda", dtype=BF16)[..., :256]
        k = torch.randn(b, s, 2, 256, device="cuda", dtype=BF16)
        wq = (0.1 * torch.randn(256, device="cuda")).to(BF16)
        wk = (0.1 * torch.randn(256, device="cuda")).to(BF16)
        cos, sin = llama_table(b, s, 64)
        yield transformers_case(
            f"Qwen3-Next {kind} q[{b},16,{s},256] (gated) k[{b},2,{s},256], rotary 64", kind, q, k,
            (1 + wq.float()).to(BF16), (1 + wk.float()).to(BF16),
            (gemma_rms_norm(wq), gemma_rms_norm(wk)), apply_partial, source, cos, sin)


def cases(quick):
    import kiln

    apply_hf, hf_source = hf_apply()
    # Qwen3-8B: 32 + 8 heads of 128. q and k as its attention makes them: the projections'
    # [B, S, H, D] views, normalised there and then transposed to [B, H, S, D] views.
    shapes = [(1, 4096, "prefill"), (8, 2048, "prefill"), (64, 1, "decode"), (1, 1, "decode")]
    for b, s, kind in (shapes[:1] + shapes[2:3] if quick else shapes):
        q = torch.randn(b, s, 32, 128, device="cuda", dtype=BF16)
        k = torch.randn(b, s, 8, 128, device="cuda", dtype=BF16)
        wq = (1 + 0.1 * torch.randn(128, device="cuda")).to(BF16)
        wk = (1 + 0.1 * torch.randn(128, device="cuda")).to(BF16)
        cos, sin = llama_table(b, s, 128)
        yield transformers_case(f"Qwen3 {kind} q[{b},32,{s},128] k[{b},8,{s},128] (heads inner)", kind,
                                q, k, wq, wk, (qwen3_rms_norm(wq), qwen3_rms_norm(wk)), apply_hf,
                                hf_source, cos, sin)

    # FLUX: 24 heads of 128 at 4096 image + 512 text tokens, an fp32 table, [B, S, H, D].
    q = torch.randn(1, 4608, 24, 128, device="cuda", dtype=BF16)
    k = torch.randn(1, 4608, 24, 128, device="cuda", dtype=BF16)
    wq = (1 + 0.1 * torch.randn(128, device="cuda")).to(BF16)
    wk = (1 + 0.1 * torch.randn(128, device="cuda")).to(BF16)
    angles = torch.rand(4608, 64, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    nq, nk = diffusers_rms_norm(wq), diffusers_rms_norm(wk)

    def flux_prologue(q, k, cos, sin):
        return flux_apply_rotary_emb(nq(q), cos, sin), flux_apply_rotary_emb(nk(k), cos, sin)

    flux_compiled = torch.compile(flux_prologue, dynamic=False)
    yield {
        "name": "FLUX q,k [1,4608,24,128] interleaved, fp32 table",
        "bytes": 2 * 2 * q.numel() * 2 + 2 * cos.numel() * 4 + 2 * 128 * 2,
        "decode": False,
        "kiln": lambda: kiln.head_norm_rope(q, k, wq, wk, cos, sin, interleaved=True, layout="bshd"),
        "kiln two-step": lambda: kiln.rope(kiln.rms_norm(q, wq, 1e-6), kiln.rms_norm(k, wk, 1e-6),
                                           cos, sin, interleaved=True, layout="bshd"),
        "peers": {"eager (diffusers, restated)": lambda: flux_prologue(q, k, cos, sin),
                  "compiled": lambda: flux_compiled(q, k, cos, sin)},
        "check": lambda: rel_err(kiln.head_norm_rope(q, k, wq, wk, cos, sin, interleaved=True,
                                                     layout="bshd")[0], flux_prologue(q, k, cos, sin)[0]),
    }
    yield from qwen3_next_cases(quick)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a subset of the shapes")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    kiln = common.fresh_kiln(256)
    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    tunes, seen = common.tune_dir(kiln), set()
    rows = []
    with torch.no_grad():
        for case in cases(args.quick):
            contenders = {"kiln": case["kiln"], "kiln two-step": case["kiln two-step"], **case["peers"]}
            row = common.time_against_copy(case["name"], case["bytes"], contenders, copy_gbs)
            row["speedup_vs_two_step"] = row["us"]["kiln two-step"] / row["us"]["kiln"]
            row["rel_err_vs_eager"] = case["check"]()
            row["kiln_tuned"] = common.tuned_configs(tunes, seen)
            if case["decode"]:
                row["host_us"] = common.host_side_by_side(contenders)
            rows.append(row)
            print(row["case"], f"{row['us']['kiln']:.1f} us", f"{row['speedup_vs_best_peer']:.2f}x",
                  flush=True)
    geomean = common.geomean_speedup(rows)
    result = {"environment": env, "copy_gbs": copy_gbs, "head_norm_rope_bf16": rows,
              "geomean_speedup_vs_best_peer": geomean, "kiln_settings": kiln.settings()}
    stamp = common.stamp(env) + (f"-{args.tag}" if args.tag else "")
    common.write_json(os.path.join(args.out, f"head_norm_rope-{stamp}.json"), result)
    lines = [
        f"Per-head q/k RMSNorm + RoPE, bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}, triton {env['versions'].get('triton', '-')}, "
        f"transformers {env['versions'].get('transformers', '-')}; copy {copy_gbs:.0f} GB/s",
        "",
        "| case | MB | kiln us (% copy) | kiln two-step us | eager us | compiled us (% copy) "
        "| kiln vs best peer | vs two-step | copy of same MB us | rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        eager = next(k for k in us if k.startswith("eager"))
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us['kiln two-step']:.1f} | {us[eager]:.1f} "
                     f"| {us['compiled']:.1f} ({pct['compiled']:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['speedup_vs_two_step']:.2f}x "
                     f"| {r['copy_same_bytes_us']:.1f} | {r['rel_err_vs_eager']:.1e} |")
    lines += common.host_lines(rows, ["kiln", "kiln two-step", "eager", "compiled"])
    lines += ["", f"Geometric mean of kiln vs the best peer: {geomean:.2f}x"]
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"head_norm_rope-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

"""RoPE: kiln beside the eager formulas of transformers (apply_rotary_pos_emb with
rotate_half) and diffusers (apply_rotary_emb, LTX-Video's apply_rotary_emb and its q/k
RMSNorm) and torch.compile of each, bf16, on the issue's grid; plus the copy-bandwidth
ceiling. Bytes count q and k read and written once, and cos/sin once where the op reads a
table (kiln.rope_3d reads none).

Usage: python bench/rope.py [--out DIR] [--quick]
Writes DIR/rope-<date>-<device>.json and .md; prints the table last."""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def local_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' Llama apply_rotary_pos_emb, restated (used if the import fails)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def hf_apply():
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        return apply_rotary_pos_emb, "transformers"
    except ImportError:
        return local_apply_rotary_pos_emb, "local copy"


def diffusers_apply_rotary_emb(x, cos, sin):
    """diffusers' apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1) on
    [B, H, S, D] with cos/sin [S, D] (diffusers is not installed on the GPU machine)."""
    cos, sin = cos[None, None], sin[None, None]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def ltx_apply_rotary_emb(x, cos, sin):
    """LTX-Video's apply_rotary_emb on [B, S, C] with cos/sin [B, S, C]."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def ltx_table(batch, dim, frames, height, width, scale=(0.32, 32, 32), theta=10000.0):
    """LTXVideoRotaryPosEmbed.forward (fp32), restated."""
    dev = "cuda"
    grid = torch.stack(torch.meshgrid(torch.arange(frames, dtype=torch.float32, device=dev),
                                      torch.arange(height, dtype=torch.float32, device=dev),
                                      torch.arange(width, dtype=torch.float32, device=dev),
                                      indexing="ij"), 0).unsqueeze(0).repeat(batch, 1, 1, 1, 1)
    grid[:, 0:1] = grid[:, 0:1] * scale[0] * 1 / 20
    grid[:, 1:2] = grid[:, 1:2] * scale[1] * 1 / 2048
    grid[:, 2:3] = grid[:, 2:3] * scale[2] * 1 / 2048
    grid = grid.flatten(2, 4).transpose(1, 2)
    freqs = theta ** torch.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6,
                                    device=dev, dtype=torch.float32)
    freqs = freqs * math.pi / 2.0
    freqs = freqs * (grid.unsqueeze(-1) * 2 - 1)
    freqs = freqs.transpose(-1, -2).flatten(2)
    cos = freqs.cos().repeat_interleave(2, dim=-1)
    sin = freqs.sin().repeat_interleave(2, dim=-1)
    if dim % 6 != 0:
        cos = torch.cat([torch.ones_like(cos[:, :, : dim % 6]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(cos[:, :, : dim % 6]), sin], dim=-1)
    return cos, sin


def llama_table(batch, seq, dim):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    pos = torch.arange(seq, device="cuda").float().expand(batch, seq)
    emb = torch.cat([pos[..., None] * inv_freq] * 2, -1)
    return emb.cos().to(BF16), emb.sin().to(BF16)  # as LlamaRotaryEmbedding returns them


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def cases(quick):
    import kiln

    apply_hf, hf_source = hf_apply()
    llama = [(1, 32, 8, 4096, 128), (8, 32, 8, 2048, 128), (1, 32, 8, 1, 128)]
    for b, hq, hk, s, d in (llama[:1] + llama[2:] if quick else llama):
        q = torch.randn(b, hq, s, d, device="cuda", dtype=BF16)
        k = torch.randn(b, hk, s, d, device="cuda", dtype=BF16)
        cos, sin = llama_table(b, s, d)
        eager = lambda q=q, k=k, c=cos, s_=sin: apply_hf(q, k, c, s_)
        compiled = torch.compile(apply_hf, dynamic=False)
        moved = 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 2
        yield {
            "name": f"rope half q{list(q.shape)} k{list(k.shape)}",
            "bytes": moved,
            "kiln": lambda q=q, k=k, c=cos, s_=sin: kiln.rope(q, k, c, s_),
            "peers": {f"HF eager ({hf_source})": eager,
                      "HF compiled": lambda q=q, k=k, c=cos, s_=sin: compiled(q, k, c, s_)},
            "check": lambda q=q, k=k, c=cos, s_=sin: rel_err(kiln.rope(q, k, c, s_)[0], apply_hf(q, k, c, s_)[0]),
        }

    flux = torch.compile(diffusers_apply_rotary_emb, dynamic=False)
    q = torch.randn(1, 24, 4608, 128, device="cuda", dtype=BF16)
    k = torch.randn(1, 24, 4608, 128, device="cuda", dtype=BF16)
    cos, sin = torch.randn(4608, 128, device="cuda"), torch.randn(4608, 128, device="cuda")
    yield {
        "name": "rope interleaved (FLUX-like) q,k [1,24,4608,128], fp32 table",
        "bytes": 2 * 2 * q.numel() * 2 + 2 * cos.numel() * 4,
        "kiln": lambda: kiln.rope(q, k, cos, sin, interleaved=True),
        "peers": {"diffusers eager": lambda: (diffusers_apply_rotary_emb(q, cos, sin),
                                              diffusers_apply_rotary_emb(k, cos, sin)),
                  "diffusers compiled": lambda: (flux(q, cos, sin), flux(k, cos, sin))},
        "check": lambda: rel_err(kiln.rope(q, k, cos, sin, interleaved=True)[0],
                                 diffusers_apply_rotary_emb(q, cos, sin)),
    }

    ltx = torch.compile(ltx_apply_rotary_emb, dynamic=False)
    # Latent grids: 49 and 161 frames at 512x768, and the issue's [2,16128,2048] (161 frames
    # at 768x1024).
    for grid in ([(7, 16, 24)] if quick else [(7, 16, 24), (21, 16, 24), (21, 24, 32)]):
        s = grid[0] * grid[1] * grid[2]
        q = torch.randn(2, s, 2048, device="cuda", dtype=BF16)
        k = torch.randn(2, s, 2048, device="cuda", dtype=BF16)
        cos, sin = ltx_table(2, 2048, *grid)
        qk_bytes = 2 * 2 * q.numel() * 2
        table_bytes = 2 * cos.numel() * 4
        peers = {"diffusers eager": lambda q=q, k=k, c=cos, s_=sin: (ltx_apply_rotary_emb(q, c, s_),
                                                                      ltx_apply_rotary_emb(k, c, s_)),
                 "diffusers compiled": lambda q=q, k=k, c=cos, s_=sin: (ltx(q, c, s_), ltx(k, c, s_))}
        yield {
            "name": f"LTX rope table [2,{s},2048]",
            "bytes": qk_bytes + table_bytes,
            "kiln": lambda q=q, k=k, c=cos, s_=sin: kiln.rope(q, k, c, s_, interleaved=True, layout="bshd"),
            "peers": peers,
            "check": lambda q=q, k=k, c=cos, s_=sin: rel_err(
                kiln.rope(q, k, c, s_, interleaved=True, layout="bshd")[0], ltx_apply_rotary_emb(q, c, s_)),
        }
        yield {
            "name": f"LTX rope_3d (no table) [2,{s},2048]",
            "bytes": qk_bytes,
            "kiln": lambda q=q, k=k, g=grid: kiln.rope_3d(q, k, *g, (0.32, 32, 32)),
            "peers": peers,
            "check": lambda q=q, k=k, g=grid, c=cos, s_=sin: rel_err(
                kiln.rope_3d(q, k, *g, (0.32, 32, 32))[0], ltx_apply_rotary_emb(q, c, s_)),
        }
        norm_q = torch.nn.RMSNorm(2048, eps=1e-5, device="cuda", dtype=BF16)
        norm_k = torch.nn.RMSNorm(2048, eps=1e-5, device="cuda", dtype=BF16)
        with torch.no_grad():
            norm_q.weight.normal_(1, 0.1)
            norm_k.weight.normal_(1, 0.1)

        def prologue(q, k, c, s_, nq=norm_q, nk=norm_k):
            return ltx_apply_rotary_emb(nq(q), c, s_), ltx_apply_rotary_emb(nk(k), c, s_)

        prologue_c = torch.compile(prologue, dynamic=False)
        wq, wk = norm_q.weight.detach(), norm_k.weight.detach()
        fused_peers = {"diffusers eager": lambda q=q, k=k, c=cos, s_=sin: prologue(q, k, c, s_),
                       "diffusers compiled": lambda q=q, k=k, c=cos, s_=sin: prologue_c(q, k, c, s_)}
        yield {
            "name": f"LTX rms_norm_rope coords [2,{s},2048]",
            "bytes": qk_bytes + 2 * 2048 * 2,
            "kiln": lambda q=q, k=k, g=grid, wq=wq, wk=wk: kiln.rms_norm_rope(
                q, k, wq, wk, 1e-5, grid=g, rope_interpolation_scale=(0.32, 32, 32)),
            "peers": fused_peers,
            "check": lambda q=q, k=k, g=grid, wq=wq, wk=wk, c=cos, s_=sin: rel_err(
                kiln.rms_norm_rope(q, k, wq, wk, 1e-5, grid=g, rope_interpolation_scale=(0.32, 32, 32))[0],
                prologue(q, k, c, s_)[0]),
        }
        yield {
            "name": f"LTX rms_norm_rope table [2,{s},2048]",
            "bytes": qk_bytes + 2 * 2048 * 2 + table_bytes,
            "kiln": lambda q=q, k=k, wq=wq, wk=wk, c=cos, s_=sin: kiln.rms_norm_rope(q, k, wq, wk, 1e-5, c, s_),
            "peers": fused_peers,
            "check": lambda q=q, k=k, wq=wq, wk=wk, c=cos, s_=sin: rel_err(
                kiln.rms_norm_rope(q, k, wq, wk, 1e-5, c, s_)[0], prologue(q, k, c, s_)[0]),
        }


# Timed in the same rounds as kiln and the peers, never counted as a peer.
COPY = "copy of the same bytes"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a subset of the grid")
    args = parser.parse_args()
    kiln = common.fresh_kiln(256)
    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    tunes, seen = common.tune_dir(kiln), set()
    rows = []
    with torch.no_grad():
        for case in cases(args.quick):
            times = common.bench_side_by_side({"kiln": case["kiln"], **case["peers"],
                                               COPY: common.same_bytes_copy(case["bytes"])})
            copy_ms = times.pop(COPY)
            best_peer = min(v for k, v in times.items() if k != "kiln")
            rows.append({
                "case": case["name"],
                "bytes": case["bytes"],
                "us": {k: v * 1e3 for k, v in times.items()},
                "copy_same_bytes_us": copy_ms * 1e3,
                "pct_of_copy": {k: 100 * case["bytes"] / (v * 1e-3) / 1e9 / copy_gbs
                                for k, v in times.items()},
                "speedup_vs_best_peer": best_peer / times["kiln"],
                "rel_err_vs_peer": case["check"](),
                "kiln_tuned": common.tuned_configs(tunes, seen),
            })
            print(rows[-1]["case"], f"{rows[-1]['us']['kiln']:.1f} us",
                  f"{rows[-1]['speedup_vs_best_peer']:.2f}x", flush=True)
    geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in rows) / len(rows))
    result = {"environment": env, "copy_gbs": copy_gbs, "rope_bf16": rows,
              "geomean_speedup_vs_best_peer": geomean, "kiln_settings": kiln.settings()}
    stamp = common.stamp(env)
    common.write_json(os.path.join(args.out, f"rope-{stamp}.json"), result)
    lines = [
        f"RoPE bf16, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}, "
        f"triton {env['versions'].get('triton', '-')}, transformers {env['versions'].get('transformers', '-')}; "
        f"copy {copy_gbs:.0f} GB/s",
        "",
        "| case | MB | kiln us (% copy) | eager us | compiled us (% copy) | kiln vs best "
        "| copy of same MB us | rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        eager = next(k for k in us if "eager" in k)
        compiled = next(k for k in us if "compiled" in k)
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us[eager]:.1f} | {us[compiled]:.1f} ({pct[compiled]:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['copy_same_bytes_us']:.1f} "
                     f"| {r['rel_err_vs_peer']:.1e} |")
    lines += ["", f"Geometric mean of kiln vs the best peer: {geomean:.2f}x"]
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"rope-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

"""Wan 2.1 (diffusers' WanTransformer3DModel), bf16, random weights, as its pipeline runs it:
the tables, time embedder and modulation tables kept in fp32 as diffusers' loader keeps them.

Two parts, on 81 frames at 480x832 (21 x 30 x 52 = 32760 latent tokens) unless told otherwise:
- the attention prologue alone (q/k RMSNorm across heads, then each head rotated from the
  [1, S, 1, 128] fp32 tables), side by side with a copy of the same bytes: diffusers' eager
  code (torch's RMSNorm modules and the rotation inside WanAttnProcessor, restated), torch.compile
  of it, kiln's fused ``rms_norm_rope`` (what a patched model runs without autograd) and kiln's
  two-step path (``kiln.rms_norm`` on q and on k, then ``kiln.rope``: what it runs with autograd).
  Bytes: q and k read and written once, both weights and the half tables once.
- one denoising step of the whole transformer in the four settings of bench/llama.py (eager,
  eager + kiln, torch.compile and torch.compile + kiln, compiled by block as diffusers'
  compile_repeated_blocks does).

Usage: python bench/wan.py [--out DIR] [--quick] [--model 1.3b|14b] [--layers N] [--frames F]
       [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/wan-<model>-<date>-<device>.json and .md; prints the table last."""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
COPY = "copy of the same bytes"
MODELS = {
    "1.3b": dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30),
    "14b": dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40),
}
COMMON = dict(patch_size=(1, 2, 2), in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
              cross_attn_norm=True, eps=1e-6, rope_max_seq_len=1024)
TINY = dict(COMMON, num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
            freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32)


def build_model(name, layers=None, tiny=False, device="cuda", seed=0, cls="WanTransformer3DModel", **more):
    """The model (diffusers' ``cls``: Wan's, or one built on its blocks, with ``more`` config) in bf16
    with the modules diffusers' loader keeps in fp32 (``_keep_in_fp32_modules``: the rotary tables,
    the time embedder, the modulation tables, the norms' parameters) in fp32."""
    import diffusers

    config = dict(TINY if tiny else dict(COMMON, **MODELS[name]), **more)
    if layers and not tiny:
        config = dict(config, num_layers=layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(diffusers, cls)(**config)
    model = model.to(BF16).eval()
    keep = model._keep_in_fp32_modules
    for name_, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if any(k in name_.split(".") for k in keep):
            tensor.data = tensor.data.float()
    # The rotary tables are buffers made in fp32 at construction: remade rather than widened back.
    rope = model.rope
    with torch.device(device):
        fresh = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
    rope.freqs_cos, rope.freqs_sin = fresh.freqs_cos, fresh.freqs_sin
    return model


def latent_shape(frames, height, width, tiny=False):
    if tiny:
        return (1, 4, 3, 8, 6)
    return (1, 16, (frames - 1) // 4 + 1, height // 8, width // 8)


def inputs(model, shape, device="cuda", seed=1):
    g = torch.Generator(device).manual_seed(seed)
    return dict(hidden_states=torch.randn(*shape, device=device, dtype=BF16, generator=g),
                timestep=torch.tensor([500], device=device),
                encoder_hidden_states=torch.randn(1, 512, model.config.text_dim, device=device, dtype=BF16,
                                                  generator=g),
                return_dict=False)


def prologue_case(heads, shape, head_dim=128):
    """The attention prologue of one Wan self-attention for latents of `shape`, each contender
    a zero-argument call."""
    import kiln
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    # diffusers' rotation, as written inside WanAttnProcessor.__call__ (kiln's fallback copy).
    from kiln.patching.wan import diffusers_rotation

    c = heads * head_dim
    seq = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    g = torch.Generator("cuda").manual_seed(2)
    q = torch.randn(1, seq, c, device="cuda", dtype=BF16, generator=g)
    k = torch.randn(1, seq, c, device="cuda", dtype=BF16, generator=g)
    norm_q = torch.nn.RMSNorm(c, eps=1e-6).cuda().to(BF16)
    norm_k = torch.nn.RMSNorm(c, eps=1e-6).cuda().to(BF16)
    with torch.no_grad():
        norm_q.weight.add_(0.2 * torch.randn(c, device="cuda", generator=g).to(BF16))
        norm_k.weight.add_(0.2 * torch.randn(c, device="cuda", generator=g).to(BF16))
    # The tables as WanRotaryPosEmbed makes them (fp32, [1, S, 1, 128]).
    rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), 1024).cuda()
    cos, sin = rope(torch.empty(shape, device="meta"))
    cos_half, sin_half = cos[..., 0::2].contiguous(), sin[..., 1::2].contiguous()

    def eager():
        qn = norm_q(q).unflatten(2, (heads, -1))
        kn = norm_k(k).unflatten(2, (heads, -1))
        return diffusers_rotation(qn, cos, sin), diffusers_rotation(kn, cos, sin)

    compiled = torch.compile(eager, dynamic=False)
    wq, wk = norm_q.weight, norm_k.weight
    fused = lambda: kiln.rms_norm_rope(q, k, wq, wk, 1e-6, cos_half, sin_half, head_dim=head_dim)  # noqa: E731

    def two_step():
        qn = kiln.rms_norm(q, wq, 1e-6).unflatten(2, (heads, -1))
        kn = kiln.rms_norm(k, wk, 1e-6).unflatten(2, (heads, -1))
        return kiln.rope(qn, kn, cos_half, sin_half, interleaved=True, rotary_dim=head_dim, layout="bshd")

    def check():
        expected = eager()[0].double().flatten(2)
        return ((fused()[0].double() - expected).abs().max() / expected.abs().max()).item()

    return {
        "name": f"Wan q,k [1,{seq},{heads}x{head_dim}] fp32 table",
        "bytes": 4 * q.numel() * 2 + 2 * c * 2 + 2 * cos_half.numel() * 4,
        "kiln": fused, "kiln two-step": two_step,
        "peers": {"eager (diffusers, restated)": eager, "compiled": compiled},
        "check": check,
    }


def prologue_rows(cases):
    import kiln

    copy_gbs = common.copy_bandwidth_gbs()
    tunes, seen = common.tune_dir(kiln), set()
    rows = []
    with torch.no_grad():
        for case in cases:
            contenders = {"kiln": case["kiln"], "kiln two-step": case["kiln two-step"], **case["peers"]}
            times = common.bench_side_by_side({**contenders, COPY: common.same_bytes_copy(case["bytes"])})
            copy_ms = times.pop(COPY)
            best_peer = min(v for k, v in times.items() if not k.startswith("kiln"))
            rows.append({
                "case": case["name"], "bytes": case["bytes"], "us": {k: v * 1e3 for k, v in times.items()},
                "copy_same_bytes_us": copy_ms * 1e3,
                "pct_of_copy": {k: 100 * case["bytes"] / (v * 1e-3) / 1e9 / copy_gbs for k, v in times.items()},
                "speedup_vs_best_peer": best_peer / times["kiln"],
                "speedup_vs_two_step": times["kiln two-step"] / times["kiln"],
                "rel_err_vs_eager": case["check"](), "kiln_tuned": common.tuned_configs(tunes, seen),
            })
            print(case["name"], f"{times['kiln'] * 1e3:.1f} us", f"{rows[-1]['speedup_vs_best_peer']:.2f}x",
                  flush=True)
    return copy_gbs, rows


def prologue_table(copy_gbs, rows):
    lines = [f"Attention prologue (copy {copy_gbs:.0f} GB/s in the same run; us, % of that copy):", "",
             "| case | MB | kiln us (% copy) | kiln two-step us | eager us | compiled us (% copy) "
             "| kiln vs best peer | vs two-step | copy of same MB us | rel err |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        eager = next(k for k in us if k.startswith("eager"))
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us['kiln two-step']:.1f} | {us[eager]:.1f} | {us['compiled']:.1f} ({pct['compiled']:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['speedup_vs_two_step']:.2f}x "
                     f"| {r['copy_same_bytes_us']:.1f} | {r['rel_err_vs_eager']:.1e} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", choices=sorted(MODELS), default="1.3b")
    parser.add_argument("--layers", type=int, default=0, help="blocks of the model (default: all of them)")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--skip-prologue", action="store_true")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "wan")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    shape = latent_shape(args.frames, args.height, args.width, args.tiny)
    seq = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    document = {"environment": env, "dtype": "bf16", "latent": list(shape), "tokens": seq}
    prologue = []
    if not args.skip_prologue and args.device == "cuda" and not args.tiny:
        heads = [MODELS[args.model]["num_attention_heads"]] + [40 if args.model != "14b" else 12]
        copy_gbs, prologue = prologue_rows([prologue_case(h, shape) for h in heads])
        document["prologue"] = {"copy_gbs": copy_gbs, "rows": prologue}
    model = build_model(args.model, args.layers, args.tiny, args.device)
    kwargs = inputs(model, shape, device=args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Wan {args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, "
          f"{seq} tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.blocks)))
    document.update(config=dict(model.config), settings=records, patch=common.patch_summary(report))
    table = markdown(env, document, args)
    common.finish_model_bench(args, f"wan-{args.model}", env, document, table, started)
    return document


def markdown(env, document, args):
    versions = env["versions"]
    config = document["config"]
    lines = [
        f"Wan {args.model}-shaped transformer ({config['num_layers']} blocks, {config['num_attention_heads']} heads "
        f"of {config['attention_head_dim']}), one step of {args.frames} frames at {args.height}x{args.width} "
        f"({document['tokens']} tokens), bf16 with diffusers' fp32 modules, {env['device']} ({env['sm']}), "
        f"{env['date']}, torch {versions['torch']}; random weights. ms = median per forward, each call timed "
        "alone after at least 1 s of warm-up calls; host ms = median time the host takes to issue one; "
        "speedup of eager+kiln over eager and of compile+kiln over compile (compiled by block); "
        f"{common.ERRORS}; first call = the compile or kiln's JIT and tuning.",
        "",
    ] + common.settings_table(document)
    if "prologue" in document:
        rows = document["prologue"]["rows"]
        lines += [""] + prologue_table(document["prologue"]["copy_gbs"], rows)
        geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in rows) / len(rows))
        lines += ["", f"Geometric mean of kiln's prologue vs the best peer: {geomean:.2f}x"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

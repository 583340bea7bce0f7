"""LTX-Video's transformer end to end: one forward of diffusers' LTXVideoTransformer3DModel
(its default config, the 2B model: 28 blocks, 32 heads x 64, caption width 4096) with
random weights, bf16, as the pipeline calls it: batch 2 (the guidance pair), 128 text
tokens, the latent of a 512x768 video (the VAE compresses 8x in time and 32x in space, so
49 frames are 7x16x24 latent tokens, 161 frames 21x16x24), a timestep. Four settings:
eager, eager + kiln (kiln.patch), torch.compile, torch.compile + kiln (the patched model
compiled). Per setting: median forward time, speedup over its baseline (eager + kiln over
eager, compile + kiln over compile), the first call's time (torch.compile's compile, kiln's
JIT), and the output's relative error against the unpatched eager output.

Usage: python bench/ltx_video.py [--out DIR] [--quick] [--frames 49,161] [--layers N]
       [--compile-scope model|blocks] [--settings eager,compile,eager+kiln,compile+kiln]
       [--device cuda|cpu] [--tiny]
Writes DIR/ltx_video-<date>-<device>.json and .md; prints the table last. --device cpu
with --tiny is a smoke run of the whole script (the CI tests build the same pieces)."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BATCH = 2
TEXT_TOKENS = 128
HEIGHT, WIDTH = 512, 768
FRAMES = [49, 161]
FRAME_RATE = 25
VAE_TEMPORAL, VAE_SPATIAL = 8, 32
# What the CI tests and --tiny build: every kind of module the default config has.
TINY = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, caption_channels=24)


def latent_size(frames, height=HEIGHT, width=WIDTH):
    """(latent frames, height, width) the pipeline gives the transformer."""
    return (frames - 1) // VAE_TEMPORAL + 1, height // VAE_SPATIAL, width // VAE_SPATIAL


def build_model(layers=None, tiny=False, device="cuda", dtype=torch.bfloat16, seed=0):
    """LTXVideoTransformer3DModel with its constructor's defaults (or TINY), `layers` blocks
    if given, random weights. The default init (PyTorch's for Linear layers, which shrinks
    each projection's variance, diffusers' own for the tables) keeps every activation
    finite in bf16 through all 28 blocks; norm weights, which start at one, get a random
    spread so the weight matters. Built on `device` in fp32, then cast."""
    from diffusers import LTXVideoTransformer3DModel

    kwargs = dict(TINY) if tiny else {}
    if layers is not None:
        kwargs["num_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = LTXVideoTransformer3DModel(**kwargs)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def build_inputs(config, frames, height=HEIGHT, width=WIDTH, batch=BATCH, text_tokens=TEXT_TOKENS, device="cuda",
                 dtype=torch.bfloat16, seed=1):
    """The transformer's keyword arguments as diffusers' LTXPipeline passes them in its
    denoising loop: latents already packed to [batch, tokens, in_channels], the prompt
    embeddings with their attention mask (the second prompt padded, as a short negative
    prompt is), one timestep per sample, the latent's size and the rope scale."""
    latent_frames, latent_height, latent_width = latent_size(frames, height, width)
    tokens = latent_frames * latent_height * latent_width
    g = torch.Generator(device="cpu").manual_seed(seed)
    mask = torch.ones(batch, text_tokens, dtype=torch.long)
    mask[1:, max(text_tokens // 3, 1):] = 0
    return dict(
        hidden_states=torch.randn(batch, tokens, config.in_channels, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(device, dtype),
        timestep=torch.full((batch,), 600.0, device=device),
        encoder_attention_mask=mask.to(device),
        num_frames=latent_frames, height=latent_height, width=latent_width,
        rope_interpolation_scale=(VAE_TEMPORAL / FRAME_RATE, VAE_SPATIAL, VAE_SPATIAL),
        return_dict=False,
    )


def forward(fn, inputs):
    return fn(**inputs)[0]


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="49 frames, 4 blocks, fewer repetitions")
    parser.add_argument("--frames", default=None, help="comma-separated video frame counts (default 49,161)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: the config's 28)")
    parser.add_argument("--settings", default=",".join(common.SETTINGS))
    parser.add_argument("--compile-scope", default="model", choices=["model", "blocks"],
                        help="torch.compile the whole model, or each transformer block in place (regional "
                             "compilation: one block's compile time instead of 28)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the tiny config of the CI tests")
    parser.add_argument("--tag", default="", help="appended to the output file names")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    kiln = common.fresh_kiln(1024)
    frames_list = [int(v) for v in args.frames.split(",")] if args.frames else ([49] if args.quick else FRAMES)
    layers = args.layers if args.layers is not None else (4 if args.quick and not args.tiny else None)
    settings = common.model_settings(args.settings, "ltx_video")
    reps = args.reps or (3 if args.quick else 10)
    warmup = 1 if args.quick else 2
    height, width = (64, 96) if args.tiny else (HEIGHT, WIDTH)

    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(layers, args.tiny, args.device)
    build_s = time.perf_counter() - started
    config = model.config
    print(f"LTX-Video transformer: {config.num_layers} blocks, {config.num_attention_heads}x{config.attention_head_dim}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, built in {build_s:.1f} s", flush=True)

    compile_fn = (common.compile_blocks(model.transformer_blocks) if args.compile_scope == "blocks"
                  else common.compile_model)
    cases = []
    for frames in frames_list:
        inputs = build_inputs(config, frames, height, width, device=args.device)
        latent = latent_size(frames, height, width)
        print(f"{frames} frames at {height}x{width}: latent {latent[0]}x{latent[1]}x{latent[2]} = "
              f"{inputs['hidden_states'].shape[1]} tokens, batch {BATCH}", flush=True)
        records, report = common.run_model_settings(model, lambda fn: forward(fn, inputs), kiln, settings=settings,
                                                    warmup=warmup, reps=reps, compile_fn=compile_fn)
        cases.append({"frames": frames, "height": height, "width": width, "latent": list(latent),
                      "tokens": inputs["hidden_states"].shape[1], "batch": BATCH, "text_tokens": TEXT_TOKENS,
                      "settings": records, "patch": common.patch_summary(report)})
        write(args, env, config, cases, final=False)
    table = write(args, env, config, cases, final=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(table)
    return cases


def write(args, env, config, cases, final):
    document = {"environment": env, "config": dict(config), "dtype": "bf16" if args.device == "cuda" else "bf16 (cpu)",
                "quick": args.quick, "compile_scope": args.compile_scope, "cases": cases,
                "errors": "max_rel = max|out - eager| / max|eager|, mean_rel = mean|out - eager| / mean|eager|, "
                          "against the unpatched eager output",
                "kiln_settings": __import__("kiln").settings()}
    name = f"ltx_video-{common.stamp(env)}{args.tag}" if final else f"ltx_video-partial{args.tag}"
    common.write_json(os.path.join(args.out, name + ".json"), document)
    if not final:
        return None
    table = markdown(env, config, cases, args.compile_scope)
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table + "\n")
    return table


def markdown(env, config, cases, compile_scope="model"):
    versions = env["versions"]
    lines = [
        f"LTX-Video transformer forward, bf16, {env['device']} ({env['sm']}), {env['date']}, torch {versions['torch']}, "
        f"diffusers {versions.get('diffusers', '-')}; {config.num_layers} blocks, random weights, batch {BATCH}, "
        f"{TEXT_TOKENS} text tokens; compile = torch.compile of the "
        f"{'whole model' if compile_scope == 'model' else 'transformer blocks, each in place'}. ms = median "
        "forward (each timed alone, after at least 1 s of warm-up calls); host ms = median time the host takes to "
        "issue one (near ms: host-bound); speedup of eager+kiln over eager and of "
        "compile+kiln over compile; errors against the unpatched eager output (max|d| / max|ref|, "
        "mean|d| / mean|ref|); first call = torch.compile's compile or kiln's JIT and tuning.",
        "",
        "| video | latent tokens | setting | ms | host ms | speedup | max rel err | mean rel err | first call s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in cases:
        video = f"{case['frames']}x{case['height']}x{case['width']}"
        for name, r in case["settings"].items():
            err = r.get("error_vs_eager")
            speedup = f"{r['speedup']:.2f}x vs {r['speedup_vs']}" if "speedup" in r else "-"
            errs = f"{err['max_rel']:.2e} | {err['mean_rel']:.2e}" if err else "- | -"
            lines.append(f"| {video} | {case['tokens']} | {name} | {r['ms']:.2f} | {common.host_cell(r)} | {speedup} | "
                         f"{errs} | {r['first_call_s']:.1f} |")
    lines.append("")
    for case in cases:
        if case["patch"]:
            lines.append(f"kiln.patch at {case['frames']} frames: replaced {case['patch']['replaced']}, "
                         f"left {case['patch']['left']}")
    return "\n".join(lines).rstrip()


if __name__ == "__main__":
    main()

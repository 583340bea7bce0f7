"""diffusers' gated feed-forward end to end: ``FeedForward(dim, activation_fn="geglu")`` as
Stable Diffusion's and SDXL's transformer blocks build it (a GEGLU projection to 2 x 4 dim, the
activation, the output projection), and ``activation_fn="swiglu"`` as Mochi's (no biases),
bf16, random weights, at the token counts of their attention levels with classifier-free
guidance's batch of 2. Four settings per shape, as bench/llama.py's: eager, eager + kiln
(kiln.patch: the chunk, the GELU or SiLU and the multiply as one kiln.geglu / kiln.swiglu of
the packed projection), torch.compile, torch.compile + kiln. The projections are matrix
products, the same in every setting; what differs is the activation's passes over the
[tokens, 2 x inner] projection. Each setting is captured in a CUDA graph and its replays are
timed (GPU time: a single module called alone and synchronised leaves the GPU waiting on the
host's launches, which in a whole network run ahead of it); host ms is the host's time to
issue one eager call, for the record.

Usage: python bench/gated_feed_forward.py [--out DIR] [--quick] [--device cuda|cpu] [--tiny] [--tag TAG]
       [--settings eager,compile,eager+kiln,compile+kiln]
Writes DIR/gated-feed-forward-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# (name, activation, dim, inner (None: diffusers' 4 x dim), bias, batch, tokens)
SHAPES = [
    ("SD 1.5 level 1", "geglu", 320, None, True, 2, 4096),
    ("SDXL level 1", "geglu", 640, None, True, 2, 4096),
    ("SDXL level 2", "geglu", 1280, None, True, 2, 1024),
    ("Mochi", "swiglu", 3072, 8192, False, 1, 8192),
]
TINY = [("tiny geglu", "geglu", 32, None, True, 2, 16), ("tiny swiglu", "swiglu", 32, 48, False, 1, 16)]


def build(activation, dim, inner, bias, device="cuda", dtype=torch.bfloat16, seed=0):
    from diffusers.models.attention import FeedForward

    torch.manual_seed(seed)
    with torch.device(device):
        model = FeedForward(dim, inner_dim=inner, activation_fn=activation, bias=bias)
    return model.to(dtype).eval()


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "gated_feed_forward")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    reps = args.reps or (5 if args.quick else 20)
    started = time.perf_counter()
    results = []
    for name, activation, dim, inner, bias, batch, tokens in (TINY if args.tiny else SHAPES):
        model = build(activation, dim, inner, bias, args.device)
        x = torch.randn(batch, tokens, dim, device=args.device, dtype=torch.bfloat16,
                        generator=torch.Generator(args.device).manual_seed(1))
        print(f"{name}: {activation}, dim {dim}, {batch}x{tokens} tokens", flush=True)
        records, report = common.run_model_settings(model, lambda fn: fn(x), kiln, settings=settings, reps=reps,
                                                    graphs=args.device == "cuda")
        results.append({"name": name, "activation": activation, "dim": dim, "inner": inner or 4 * dim,
                        "bias": bias, "batch": batch, "tokens": tokens, "settings": records,
                        "patch": common.patch_summary(report)})
    table = markdown(env, results)
    common.finish_model_bench(args, "gated-feed-forward", env, {"environment": env, "dtype": "bf16", "cases": results},
                              table, started)
    return results


def markdown(env, results):
    versions = env["versions"]
    timing = ("replayed from a CUDA graph" if any(s["cuda_graph"] for r in results for s in r["settings"].values())
              else "each call timed alone")
    lines = [
        f"diffusers' gated FeedForward, bf16, {env['device']} ({env['sm']}), {env['date']}, torch {versions['torch']}; "
        f"random weights. ms = median per forward, {timing}, each setting timed alone after at least 1 s of warm-up "
        "calls; host ms = median time the host takes to issue one; speedup of eager+kiln over eager and of "
        "compile+kiln over compile; errors against the eager output (max|d| / max|ref|).",
        "",
        "| shape | activation | dim x inner | tokens | setting | ms | host ms | speedup | max rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        for name, s in r["settings"].items():
            err = s.get("error_vs_eager")
            speedup = f"{s['speedup']:.2f}x vs {s['speedup_vs']}" if "speedup" in s else "-"
            error = f"{err['max_rel']:.2e}" if err else "-"
            lines.append(f"| {r['name']} | {r['activation']} | {r['dim']} x {r['inner']} | {r['batch']}x{r['tokens']} "
                         f"| {name} | {s['ms']:.3f} | {common.host_cell(s)} | {speedup} | {error} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

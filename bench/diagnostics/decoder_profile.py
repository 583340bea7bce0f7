"""Where a compiled decoder's prefill time goes with and without kiln's patch (bench/llama.py's
models and inputs): torch.compile of the unpatched model, of the patched model, and of the
patched model with one of the patch's parts left out (llama.py's --apart names), each timed as
llama.py times it (median of CUDA-event timed forwards), then one forward of each under
torch.profiler by kind of kernel (flux_profile.py's kinds), and the kernels whose total time
differs most from the unpatched compile's.

Usage: python bench/diagnostics/decoder_profile.py [--model qwen3-moe] [--layers N]
       [--prefill BxT] [--apart experts,head-norms,residual-norms] [--top N] [--out DIR] [--tag TAG]
Writes DIR/decoder-profile-<date>-<device>-<model>[-TAG]-diagnostics.md and prints it."""

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import flux_profile  # noqa: E402
import llama  # noqa: E402


def settings(kiln, apart):
    """{name: patch function or None}: compile of the model as built, as patched, and as
    patched without each of `apart`."""
    found = {"compile": None, "compile+kiln": kiln.patch}
    for name in apart:
        found[f"compile+kiln, {name} apart"] = llama.APART[name][1](kiln)
    return found


def by_kind(times):
    totals = collections.Counter()
    for kernel, (_, us) in times.items():
        totals[flux_profile.kind(kernel)] += us
    return totals


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3-moe", choices=sorted(llama.MODELS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prefill", default="2x2048")
    parser.add_argument("--apart", default="experts,head-norms,residual-norms")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--out", default="bench/results/latest")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    config = llama.llama_config(args.layers, False, args.model)
    model = llama.build_model(config)
    batch, tokens = (int(v) for v in args.prefill.split("x"))
    inputs = llama.prefill_inputs(config, batch, tokens)
    apart = [a for a in args.apart.split(",") if a]
    unknown = sorted(set(apart) - set(llama.APART))
    if unknown:
        raise SystemExit(f"decoder_profile: --apart: expected names among {sorted(llama.APART)}, got {unknown}")

    profiles, medians = {}, {}
    with torch.no_grad():
        for name, patch in settings(kiln, apart).items():
            if patch is not None:
                patch(model)
            torch._dynamo.reset()
            compiled = torch.compile(model, dynamic=False)
            call = lambda: compiled(**inputs).logits  # noqa: E731
            medians[name] = common.model_times(call, 2, args.reps)["ms"]
            profiles[name] = flux_profile.kernel_times(call)
            del compiled, call
            torch._dynamo.reset()
            kiln.unpatch(model)
            print(f"{name}: {medians[name]:.3f} ms", flush=True)

    kinds = [k for k, _ in flux_profile.KINDS] + ["rest"]
    env = common.model_environment("cuda")
    versions = env["versions"]
    lines = [f"{llama.MODELS[args.model][2]}-shaped, {args.layers} layers, prefill {args.prefill}, bf16, "
             f"{env['device']} ({env['sm']}), {env['date']}, torch {versions['torch']}, transformers "
             f"{versions.get('transformers', '-')}. Median ms: CUDA-event timed forwards, the settings one "
             "after the other; then GPU ms of one profiled forward by kind of kernel.", "",
             "| setting | median ms | " + " | ".join(kinds) + " | kernels | profiled ms |",
             "| --- " * (len(kinds) + 4) + "|"]
    for name, times in profiles.items():
        totals = by_kind(times)
        calls = sum(c for c, _ in times.values())
        cells = " | ".join(f"{totals[k] / 1e3:.3f}" for k in kinds)
        lines.append(f"| {name} | {medians[name]:.3f} | {cells} | {calls} | {sum(totals.values()) / 1e3:.3f} |")

    base = profiles["compile"]
    for name, times in profiles.items():
        if name == "compile":
            continue
        names = set(base) | set(times)
        moved = sorted(names, key=lambda k: -abs(times.get(k, (0, 0.0))[1] - base.get(k, (0, 0.0))[1]))
        lines += ["", f"{name} against compile: kernels whose total moved most (ms, calls)", ""]
        for kernel in moved[:args.top]:
            was, now = base.get(kernel, (0, 0.0)), times.get(kernel, (0, 0.0))
            lines.append(f"    {now[1] / 1e3 - was[1] / 1e3:+8.3f}  {was[1] / 1e3:7.3f} ({was[0]:3d}) -> "
                         f"{now[1] / 1e3:7.3f} ({now[0]:3d})  [{flux_profile.kind(kernel)}] {kernel[:100]}")
    os.makedirs(args.out, exist_ok=True)
    common.write_diagnostics(args.out, "decoder-profile", env, "-".join(filter(None, [args.model, args.tag])),
                             "\n".join(lines))


if __name__ == "__main__":
    main()

"""Where a compiled decoder's prefill time goes with and without kiln's patch (bench/llama.py's
models and inputs): torch.compile of the unpatched model, of the patched model, and of the
patched model with one of the patch's parts left out (llama.py's --apart names), each timed as
llama.py times it (median of CUDA-event timed forwards), then one forward of each under
torch.profiler by kind of kernel (flux_profile.py's kinds), and the kernels whose total time
differs most from the unpatched compile's, and the GPU's idle time before kernels of each kind.

One profiled forward is one sample: on an H200 the same matmuls and attention took up to 10%
longer in a setting profiled later in the run than in the first (--again re-runs the unpatched
compile at the end to show it), while the medians of the same settings held within 0.2%. Read
the per-kernel differences for kernels whose count or kind changes between settings (a fusion
made or lost), and the medians for the whole. The settings' medians are timed one after the
other, each after its compile; --rounds keeps every setting's compiled copy of the model and
times them again in interleaved rounds, so a drift of the GPU's speed falls on all alike.

Usage: python bench/diagnostics/decoder_profile.py [--model qwen3-moe] [--layers N]
       [--prefill BxT] [--apart experts,head-norms,residual-norms] [--plain] [--again]
       [--rounds N] [--top N] [--out DIR] [--tag TAG]
Writes DIR/decoder-profile-<date>-<device>-<model>[-TAG]-diagnostics.md and prints it."""

import argparse
import collections
import copy
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import flux_profile  # noqa: E402
import llama  # noqa: E402


def settings(kiln, apart, plain=False, again=False):
    """[(name, patch function or None, kiln's pdl setting)]: compile of the model as built, as
    patched, as patched without each of `apart`; with `plain`, as patched with kiln's kernels
    launched without programmatic dependent launch; with `again`, the unpatched compile once
    more at the end (how far the GPU's own speed drifted over the run)."""
    found = [("compile", None, "on"), ("compile+kiln", kiln.patch, "on")]
    found += [(f"compile+kiln, {name} apart", llama.APART[name][1](kiln), "on") for name in apart]
    if plain:
        found.append(("compile+kiln, plain launches", kiln.patch, "off"))
    if again:
        found.append(("compile, again", None, "on"))
    return found


def idle_before(spans):
    """{kind of kernel: (us the GPU sat idle just before kernels of that kind, how many)}:
    the gap from the end of everything started earlier to each kernel's start."""
    idle = collections.defaultdict(lambda: [0.0, 0])
    busy_until = None
    for start, end, name in spans:
        if busy_until is not None:
            entry = idle[flux_profile.kind(name)]
            entry[0] += max(0.0, start - busy_until)
            entry[1] += 1
        busy_until = end if busy_until is None else max(busy_until, end)
    return idle


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
    parser.add_argument("--plain", action="store_true",
                        help="also the patched compile with kiln's kernels launched without PDL")
    parser.add_argument("--again", action="store_true", help="the unpatched compile once more at the end")
    parser.add_argument("--rounds", type=int, default=0,
                        help="keep every setting's compiled model and time them again in this many rounds, "
                             "each round in a shuffled order")
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

    profiles, medians, gaps, lengths, kept = {}, {}, {}, {}, {}
    with torch.no_grad():
        for name, patch, pdl in settings(kiln, apart, args.plain, args.again):
            kiln.configure(pdl=pdl)
            # With --rounds every setting keeps a compiled copy of its own, timed again later.
            module = copy.deepcopy(model) if args.rounds else model
            if patch is not None:
                patch(module)
            if not args.rounds:
                torch._dynamo.reset()
            compiled = torch.compile(module, dynamic=False)
            call = lambda compiled=compiled: compiled(**inputs).logits  # noqa: E731
            medians[name] = common.model_times(call, 2, args.reps)["ms"]
            profiles[name], spans = flux_profile.kernel_trace(call)
            gaps[name] = idle_before(spans)
            lengths[name] = max(end for _, end, _ in spans) - spans[0][0]
            if args.rounds:
                kept[name] = (call, pdl)
            else:
                del compiled, call
                torch._dynamo.reset()
                kiln.unpatch(module)
            kiln.configure(pdl="on")
            print(f"{name}: {medians[name]:.3f} ms", flush=True)
        rounds = {name: [] for name in kept}
        order = list(kept)
        for number in range(args.rounds):
            random.Random(number).shuffle(order)
            for name in order:
                call, pdl = kept[name]
                kiln.configure(pdl=pdl)
                rounds[name].append(common.model_times(call, 2, args.reps, warmup_s=0.3)["ms"])
            kiln.configure(pdl="on")

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

    lines += ["", "The profiled forward from its first kernel's start to its last kernel's end, and the GPU's "
              "idle time in it before kernels of each kind (ms, kernels):", "",
              "| setting | first to last kernel ms | " + " | ".join(kinds) + " |",
              "| --- " * (len(kinds) + 2) + "|"]
    for name in profiles:
        cells = " | ".join(f"{gaps[name][k][0] / 1e3:.3f} ({gaps[name][k][1]})" for k in kinds)
        lines.append(f"| {name} | {lengths[name] / 1e3:.3f} | {cells} |")

    if rounds:
        lines += ["", f"Every setting's compiled model timed again in {args.rounds} rounds, each in a shuffled "
                      f"order (median of {args.reps} forwards a round), ms:", "",
                  "| setting | median of the rounds | min | max | vs compile |", "| --- | --- | --- | --- | --- |"]
        base_ms = statistics.median(rounds["compile"])
        for name, times in rounds.items():
            mid = statistics.median(times)
            lines.append(f"| {name} | {mid:.3f} | {min(times):.3f} | {max(times):.3f} | {base_ms / mid:.3f}x |")

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

"""One fusion of kiln.patch, end to end: the decoder of bench/llama.py patched two ways side
by side, with the fusion and without it. --fusion residual-norms: each layer's residual add
and the norm after it as one kiln.fused_add_rms_norm, or the add in torch and kiln.rms_norm;
--fusion head-norms (Qwen3 only): each attention's q/k norms and rotation as one
kiln.head_norm_rope, or kiln.rms_norm on q, on k, then kiln.rope. The end-to-end bench times
its settings one after the other, and their medians move by a few percent between runs, more
than the difference expected here (tens of us a layer). So both models, same weights, are
captured in CUDA graphs (prefill without cache and a decode step) and the replays alternate,
A B A B, each timed with CUDA events; then one forward of each under the profiler sums the
GPU time of the kernels that differ.

Usage: python bench/diagnostics/fusion_e2e.py [--fusion residual-norms|head-norms] [--model llama|qwen3]
       [--layers N] [--rounds N] [--decode-batches 1,32] [--out DIR] [--tag TAG]"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import llama  # noqa: E402


def graphed(kiln, fn):
    graph, out = common.capture_graph(fn, kiln)
    return graph, out


def alternate(graphs, rounds):
    """Median ms of each graph's replay, replays interleaved over `rounds`."""
    times = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


def kernel_times(fn):
    """{kernel name: (calls, total us)} of one call of fn, on the GPU."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    found = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        calls, total = found.get(event.name, (0, 0.0))
        found[event.name] = (calls + 1, total + event.time_range.elapsed_us())
    return found


FUSIONS = {
    "residual-norms": ("each layer's residual add and the norm after it as one kiln.fused_add_rms_norm",
                       "the add in torch, then kiln.rms_norm"),
    "head-norms": ("q/k norms and RoPE as one kiln.head_norm_rope", "kiln.rms_norm on q, on k, then kiln.rope"),
}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--fusion", default="residual-norms", choices=sorted(FUSIONS))
    parser.add_argument("--model", default=None, choices=sorted(llama.MODELS),
                        help="default: qwen3 for head-norms, llama otherwise")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--decode-batches", default="32")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    model_name = args.model or ("qwen3" if args.fusion == "head-norms" else "llama")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment("cuda")
    config = llama.llama_config(args.layers, model=model_name)
    models = {"fused": llama.build_model(config), "apart": llama.build_model(config)}
    kiln.patch(models["fused"])
    llama.APART[args.fusion][1](kiln)(models["apart"])
    prompt = llama.prefill_inputs(config, *llama.PREFILL)
    fused, apart = FUSIONS[args.fusion]
    lines = [f"{llama.MODELS[model_name][2]}-shaped decoder ({args.layers} layers), bf16, {env['device']} "
             f"({env['sm']}), {env['date']}, torch {env['versions']['torch']}, transformers "
             f"{env['versions'].get('transformers', '-')}. fused: {fused}; apart: {apart}. CUDA graph replays "
             f"alternated over {args.rounds} rounds, median ms.", "",
             "| case | fused ms | apart ms | apart / fused | max abs diff of the logits |",
             "| --- | --- | --- | --- | --- |"]
    profiles = {}
    with torch.no_grad():
        cases = {"prefill 2x2048": {name: (lambda m=m: m(**prompt).logits) for name, m in models.items()}}
        for batch in (int(b) for b in args.decode_batches.split(",") if b):
            states = {name: llama.decode_state(m, batch, llama.PAST) for name, m in models.items()}
            cases[f"decode, batch {batch}, {llama.PAST} past"] = {name: (lambda s=states[name], m=m: s[2](m))
                                                                  for name, m in models.items()}
        for case, fns in cases.items():
            captured = {name: graphed(kiln, fn) for name, fn in fns.items()}
            medians = alternate({name: g for name, (g, _) in captured.items()}, args.rounds)
            diff = (captured["fused"][1].float() - captured["apart"][1].float()).abs().max().item()
            lines.append(f"| {case} | {medians['fused']:.3f} | {medians['apart']:.3f} | "
                         f"{medians['apart'] / medians['fused']:.4f} | {diff:.3g} |")
            profiles[case] = {name: kernel_times(fn) for name, fn in fns.items()}
            del captured
    lines += ["", "GPU time of one forward by kernel (profiler), where the two differ:", "",
              "| case | kernel | fused calls, us | apart calls, us |", "| --- | --- | --- | --- |"]
    for case, by_model in profiles.items():
        names = sorted(set(by_model["fused"]) | set(by_model["apart"]))
        totals = {m: sum(t for _, t in by_model[m].values()) for m in by_model}
        for name in names:
            f, a = by_model["fused"].get(name, (0, 0.0)), by_model["apart"].get(name, (0, 0.0))
            if f[0] != a[0] or "kiln" in name or "rope" in name or "norm" in name or "add" in name:
                lines.append(f"| {case} | {name[:60]} | {f[0]}, {f[1]:.1f} | {a[0]}, {a[1]:.1f} |")
        lines.append(f"| {case} | all kernels | {totals['fused']:.1f} us | {totals['apart']:.1f} us |")
    text = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    name = f"{args.fusion}-e2e-{model_name}-{common.stamp(env)}{args.tag}-diagnostics.md"
    with open(os.path.join(args.out, name), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

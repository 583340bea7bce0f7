"""Where one FLUX step's GPU time goes (bench/flux.py's model and inputs; with --model chroma,
bench/chroma.py's, and a setting with Chroma's blocks left to diffusers), by kind of kernel:
matmuls, attention, kiln's kernels, Inductor's (Triton) kernels and the rest (PyTorch's own
elementwise and reduction kernels), for each setting of the end-to-end bench; then the rest's
largest kernels. One forward of each setting under torch.profiler after two warm-up calls.

Usage: python bench/diagnostics/flux_profile.py [--model flux|chroma] [--layers N] [--single-layers N]
       [--height H] [--width W] [--top N] [--settings ...]"""

import argparse
import collections
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import chroma  # noqa: E402
import common  # noqa: E402
import flux  # noqa: E402

BLOCKS_APART = "eager+kiln-blocks-apart"  # a --settings name (no comma)

# Attention first: cuDNN's and FlashAttention's kernel names also carry an architecture tag.
KINDS = (("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
         ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_", re.I)),
         ("inductor", re.compile(r"^triton", re.I)),
         ("kiln", re.compile(r"^(kiln|norm|elementwise|rms_norm_rope|rope|sum_partials)\b|kiln::", re.I)))


def kind(name):
    return next((k for k, pattern in KINDS if pattern.search(name)), "rest")


def kernel_trace(call):
    """One call's kernels under torch.profiler after two warm-up calls: {name: [calls, total
    us]} and the [(start us, end us, name)] of every kernel in start order."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    times = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name][0] += 1
            times[event.name][1] += event.device_time
            spans.append((event.time_range.start, event.time_range.end, event.name))
    return times, sorted(spans)


def kernel_times(call):
    """{kernel name: [calls, total us]} of one call."""
    return kernel_trace(call)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["flux", "chroma"], default="flux")
    parser.add_argument("--layers", type=int, default=0)
    parser.add_argument("--single-layers", type=int, default=None)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--settings", default=",".join(common.SETTINGS))
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    if args.model == "chroma":
        model = chroma.build_model(args.layers, args.single_layers)
        kwargs = chroma.build_inputs(dict(model.config))
        patches = {"eager+kiln": kiln.patch, "compile+kiln": kiln.patch, BLOCKS_APART: chroma.blocks_apart(kiln)}
    else:
        model = flux.build_model("dev", args.layers, args.single_layers)
        kwargs = flux.build_inputs(dict(model.config), args.height, args.width)
        patches = {"eager+kiln": kiln.patch, "compile+kiln": kiln.patch}
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    settings = args.settings.split(",")
    profiles = {}
    with torch.no_grad():
        for name in settings:
            if name in patches:
                patches[name](model)
            fn, undo = (common.compile_blocks(blocks)(model) if name.startswith("compile") else (model, lambda: None))
            profiles[name] = kernel_times(lambda: fn(**kwargs))
            undo()
            torch._dynamo.reset()
            kiln.unpatch(model)
    print("| setting | " + " | ".join(k for k, _ in KINDS) + " | rest | total ms |")
    print("| --- " * (len(KINDS) + 3) + "|")
    for name, times in profiles.items():
        by_kind = collections.Counter()
        for kernel, (_, us) in times.items():
            by_kind[kind(kernel)] += us
        cells = " | ".join(f"{by_kind[k] / 1e3:.2f}" for k, _ in KINDS + (("rest", None),))
        print(f"| {name} | {cells} | {sum(by_kind.values()) / 1e3:.2f} |")
    for name, times in profiles.items():
        rest = sorted(((us, calls, kernel) for kernel, (calls, us) in times.items() if kind(kernel) in ("rest",
                                                                                                       "inductor")),
                      reverse=True)[:args.top]
        print(f"\n{name}: largest kernels besides matmuls, attention and kiln's")
        for us, calls, kernel in rest:
            print(f"  {us / 1e3:7.3f} ms {calls:4d} calls  {kernel[:110]}")
        kiln_kernels = sorted(((us, calls, kernel) for kernel, (calls, us) in times.items() if kind(kernel) == "kiln"),
                              reverse=True)[:6]
        for us, calls, kernel in kiln_kernels:
            print(f"  kiln {us / 1e3:7.3f} ms {calls:4d} calls  {kernel[:100]}")


if __name__ == "__main__":
    main()

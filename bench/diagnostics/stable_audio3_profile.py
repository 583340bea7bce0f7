"""Where one Stable Audio 3 step's GPU time goes (bench/stable_audio3.py's model and inputs), by
kind of kernel and by the largest kernels, in eager and compiled (by block) settings, with and
without kiln, and compiled with kiln's patch but the feed-forwards left to diffusers; with the
graphs and graph breaks Dynamo counted for each compiled setting and the median ms and host ms of
the bench's timing.

Usage: python bench/diagnostics/stable_audio3_profile.py [--layers N] [--frames N] [--top N]"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import flux_profile  # noqa: E402
import stable_audio3  # noqa: E402


def report(setting, call, top):
    from torch._dynamo.utils import counters

    counters.clear()
    times = flux_profile.kernel_times(call)
    with torch.no_grad():
        t = common.model_times(call, 3, 10)
    by_kind = {}
    for name, (calls, us) in times.items():
        entry = by_kind.setdefault(flux_profile.kind(name), [0, 0.0])
        entry[0] += calls
        entry[1] += us
    total = sum(us for _, us in times.values())
    print(f"\n== {setting}: {t['ms']:.2f} ms, host {t['host_ms']:.2f} ms, kernels {total / 1e3:.2f} ms; "
          f"graphs {counters['stats'].get('unique_graphs', 0)}, breaks {sum(counters['graph_break'].values())}")
    for reason, count in counters["graph_break"].items():
        print(f"   break x{count}: {reason[:200]}")
    for k, (calls, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"   {k:10s} {calls:6d} kernels {us / 1e3:8.2f} ms")
    for name, (calls, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"     {us / 1e3:8.2f} ms {calls:5d}x {name[:110]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--frames", type=int, default=1024)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    model = stable_audio3.build_model(args.layers)
    kwargs, _, _ = stable_audio3.inputs(model, args.frames)
    blocks = list(model.transformer_blocks)

    def call():
        with torch.no_grad():
            return model(**kwargs)

    def compiled(setting):
        torch._dynamo.reset()
        _, undo = common.compile_blocks(blocks)(model)
        report(setting, call, args.top)
        undo()
        torch._dynamo.reset()

    report("eager", call, args.top)
    compiled("compile")
    kiln.patch(model)
    report("eager+kiln", call, args.top)
    compiled("compile+kiln")
    for block in blocks:
        kiln.unpatch(block.ff)
    compiled("compile+kiln, feed-forwards diffusers'")


if __name__ == "__main__":
    main()

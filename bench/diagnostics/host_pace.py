"""Whether a host-bound tower's wall time follows kiln's patch or the process's state: one
process runs bench/vision_towers.py's tower (default Qwen2.5-VL's) eager, patched, eager again
(unpatched) and patched again, and at each stage times, besides the forward, a fixed piece of
host work that touches neither the tower nor kiln (a pure-Python loop, and small CUDA tensor
ops that queue a launch each), and reads the process's threads: how many, and the CPU time each
took while the forward was timed (a busy thread beside the main one shows there).

Usage: python bench/diagnostics/host_pace.py [--model qwen2.5-vl] [--tiny] [--reps 10]
       [--stages eager,kiln,eager,kiln,kiln:pdl=off]

A stage `kiln:setting=value` first calls kiln.configure(setting=value) (kept for later stages)."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import vision_towers  # noqa: E402


def python_pace(n=200_000):
    """Microseconds per iteration of a pure-Python loop."""
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i & 7
    return (time.perf_counter() - start) / n * 1e6


def launch_pace(x, n=2000):
    """Microseconds per small CUDA op issued (each a view and a launch), the GPU not waited on."""
    common._sync()
    start = time.perf_counter()
    for _ in range(n):
        x.transpose(0, 1).add_(0)
    elapsed = time.perf_counter() - start
    common._sync()
    return elapsed / n * 1e6


def thread_times():
    """{thread id: (name, CPU seconds)} of this process's threads."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[tid] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-vl", choices=sorted(vision_towers.TOWERS))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--stages", default="eager,kiln,eager,kiln")
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    tower, _ = vision_towers.build(args.model, args.tiny, "cuda")
    kwargs = vision_towers.inputs(args.model, tower, args.tiny, "cuda")
    forward = lambda: tower(**kwargs)  # noqa: E731
    small = torch.randn(64, 64, device="cuda")
    print(f"main thread {os.getpid()}, CPUs allowed {sorted(os.sched_getaffinity(0))}")
    patched = False
    with torch.no_grad():
        for stage, name in enumerate(args.stages.split(",")):
            if ":" in name:
                setting, value = name.split(":", 1)[1].split("=")
                kiln.configure(**{setting: value})
            if name.startswith("kiln") != patched:
                (kiln.patch if name.startswith("kiln") else kiln.unpatch)(tower)
                patched = name.startswith("kiln")
            for _ in range(3):
                forward()
            common._sync()
            before, wall = thread_times(), time.perf_counter()
            timing = common.model_times(forward, 3, args.reps)
            wall, after = time.perf_counter() - wall, thread_times()
            busy = sorted(((after[t][1] - before.get(t, (None, 0.0))[1]) / wall, after[t][0], t) for t in after)
            busy.reverse()
            shown = ", ".join(f"{n}[{t}] {share:.0%}" for share, n, t in busy[:4])
            print(f"stage {stage} {name}: {timing['ms']:.2f} ms, host {timing['host_ms']:.2f} ms; python loop "
                  f"{python_pace():.4f} us/iter, small CUDA ops {launch_pace(small):.2f} us each; "
                  f"{len(after)} threads, busiest (CPU share of the timed {wall:.1f} s): {shown}", flush=True)


if __name__ == "__main__":
    main()

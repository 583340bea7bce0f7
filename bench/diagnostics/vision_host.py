"""Where a vision tower's host time goes, unpatched and patched by kiln: one forward of
bench/vision_towers.py's tower under torch.profiler (host and GPU), per operator the calls and
the host's self time in each setting, largest differences first, and the time the host spent
waiting on the GPU (synchronizations); then the same forwards under cProfile, per Python
function its own time, and Python's garbage collections and their time per forward. For host-bound towers (Qwen2.5-VL's window attention
issues one sdpa per window) whose wall time a patch moves the other way from their kernels'.

Usage: python bench/diagnostics/vision_host.py [--model qwen2.5-vl] [--tiny] [--device cuda]
       [--forwards 3] [--top 25]"""

import argparse
import collections
import cProfile
import gc
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import vision_towers  # noqa: E402

# Host calls that wait for the GPU: their time is the GPU's, not the host's own work.
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def host_profile(forward, forwards):
    """{operator: (calls, host self us)} per forward, and the forward's host wall time in us."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for _ in range(3):
        forward()
    common._sync()
    with profile(activities=activities) as prof:
        for _ in range(forwards):
            forward()
        common._sync()
    table = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CPU:
            table[event.key][0] += event.count / forwards
            table[event.key][1] += event.self_cpu_time_total / forwards
    return dict(table)


def python_profile(forward, forwards):
    """{function: own seconds} per forward under cProfile, and (collections, seconds in them)
    of Python's garbage collector per forward, counted without the profiler."""
    pauses = []

    def timed_collection(phase, info):
        if phase == "start":
            pauses.append(time.perf_counter())
        elif pauses:
            pauses[-1] = time.perf_counter() - pauses[-1]

    gc.callbacks.append(timed_collection)
    try:
        for _ in range(forwards):
            forward()
        common._sync()
    finally:
        gc.callbacks.remove(timed_collection)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(forwards):
        forward()
    common._sync()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    own = {f"{os.path.basename(file)}:{line} {name}": tottime / forwards
           for (file, line, name), (_, _, tottime, _, _) in stats.items()}
    return own, (len(pauses) / forwards, sum(pauses) / forwards)


def difference_table(base, patched, top, unit, scale):
    """Rows of a markdown table: the `top` keys whose values differ most."""
    keys = sorted(set(base) | set(patched), key=lambda k: -abs(patched.get(k, 0.0) - base.get(k, 0.0)))
    rows = [f"| function | eager {unit} | eager+kiln {unit} | difference {unit} |", "| --- | --- | --- | --- |"]
    for key in keys[:top]:
        b, p = base.get(key, 0.0) * scale, patched.get(key, 0.0) * scale
        rows.append(f"| {key} | {b:.0f} | {p:.0f} | {p - b:+.0f} |")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-vl", choices=sorted(vision_towers.TOWERS))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--forwards", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    tower, _ = vision_towers.build(args.model, args.tiny, args.device)
    kwargs = vision_towers.inputs(args.model, tower, args.tiny, args.device)
    forward = lambda: tower(**kwargs)  # noqa: E731
    profiles, times, python, collections_ = {}, {}, {}, {}
    with torch.no_grad():
        for name in ("eager", "eager+kiln"):
            if name == "eager+kiln":
                kiln.patch(tower)
            times[name] = common.model_times(forward, 3, 10)
            profiles[name] = host_profile(forward, args.forwards)
            python[name], collections_[name] = python_profile(forward, args.forwards)
    base, patched = profiles["eager"], profiles["eager+kiln"]
    for name, timing in times.items():
        waits = sum(profiles[name].get(w, (0, 0.0))[1] for w in WAITS)
        own = sum(us for _, us in profiles[name].values())
        print(f"{name}: {timing['ms']:.2f} ms, host {timing['host_ms']:.2f} ms; profiled host self time "
              f"{own / 1e3:.2f} ms per forward, of it waiting on the GPU {waits / 1e3:.2f} ms")
    keys = sorted(set(base) | set(patched),
                  key=lambda k: -abs(patched.get(k, (0, 0.0))[1] - base.get(k, (0, 0.0))[1]))
    print(f"\n| operator | calls eager | calls eager+kiln | host self us eager | host self us eager+kiln | difference us |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key in keys[:args.top]:
        (c0, t0), (c1, t1) = base.get(key, (0, 0.0)), patched.get(key, (0, 0.0))
        print(f"| {key} | {c0:g} | {c1:g} | {t0:.0f} | {t1:.0f} | {t1 - t0:+.0f} |")
    print()
    for name, (count, seconds) in collections_.items():
        print(f"{name}: {count:g} garbage collections per forward, {seconds * 1e3:.2f} ms in them")
    print(f"\nPython functions' own time per forward (cProfile), {sum(python['eager'].values()) * 1e3:.1f} ms "
          f"eager, {sum(python['eager+kiln'].values()) * 1e3:.1f} ms eager+kiln:\n")
    print("\n".join(difference_table(python["eager"], python["eager+kiln"], args.top, "us", 1e6)))


if __name__ == "__main__":
    main()

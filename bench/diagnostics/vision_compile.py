"""Which kiln op of a patched vision tower changes its forward's time, compiled by block and
eager: bench/vision_towers.py's tower (default Qwen3-VL's), unpatched and patched with each op
of kiln.patch alone and all together, the settings in turn for `--rounds` rounds in one process
(the tower is host-bound: its attention reads the sequence lengths back in every block, and a
host-bound time moves by tens of percent between processes). Per setting and round: median GPU
(CUDA events) and host ms of a forward, its kernels' GPU time (torch.profiler), and Dynamo's
graph breaks and unique graphs.

Usage: python bench/diagnostics/vision_compile.py [--model qwen3-vl] [--rounds 2] [--reps 20]
       [--settings eager,eager+kiln,...] [--tiny] [--device cpu]"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import vision_towers  # noqa: E402

# (setting, compiled, the ops kiln.patch is given: None unpatched, () all of them)
SETTINGS = [("eager", False, None), ("eager+kiln", False, ()), ("compile", True, None),
            ("compile+norms", True, ("layer_norm", "rms_norm")), ("compile+rope", True, ("rope",)),
            ("compile+mlp", True, ("gelu", "swiglu")), ("compile+kiln", True, ())]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3-vl", choices=sorted(vision_towers.TOWERS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--settings", default=",".join(name for name, _, _ in SETTINGS),
                        help="the settings to run, comma separated")
    args = parser.parse_args()
    chosen = args.settings.split(",")
    unknown = sorted(set(chosen) - {name for name, _, _ in SETTINGS})
    if unknown:
        raise SystemExit(f"vision_compile.py: --settings: unknown {unknown}")
    kiln = common.fresh_kiln(1024)
    from torch._dynamo.utils import counters

    tower, blocks = vision_towers.build(args.model, args.tiny, args.device)
    kwargs = vision_towers.inputs(args.model, tower, args.tiny, args.device)
    forward = lambda: tower(**kwargs)  # noqa: E731
    for round_ in range(args.rounds):
        for name, compiled, ops in (setting for setting in SETTINGS if setting[0] in chosen):
            torch._dynamo.reset()
            counters.clear()
            if ops is not None:
                kiln.patch(tower, ops=ops or None)
            if compiled:
                for block in blocks:
                    block.compile(dynamic=False)
            with torch.no_grad():
                timing = common.model_times(forward, 3, args.reps)
                gpu_ms = common.kernel_ms(forward)
            breaks = sum(sum(v.values()) if isinstance(v, dict) else v for v in counters["graph_break"].values())
            kernels = f", kernels {gpu_ms:.2f} ms" if gpu_ms is not None else ""
            print(f"round {round_} {name}: {timing['ms']:.2f} ms, host {timing['host_ms']:.2f} ms{kernels}, "
                  f"graph breaks {breaks}, unique graphs {counters['stats'].get('unique_graphs', 0)}", flush=True)
            for block in blocks:
                block._compiled_call_impl = None
            kiln.unpatch(tower)


if __name__ == "__main__":
    main()

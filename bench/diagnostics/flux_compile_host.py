"""FLUX at a host-bound size, the compiled settings timed in one process: torch.compile by
block of the unpatched model, of the patched model, and of the patched model with its
double-stream blocks left to Inductor under compile; the three in turn, `--rounds` times.
bench/flux.py times each setting once, one after the other, and at 512x512 every setting's
time is its host time, which moves by tens of percent between processes.

Usage: python bench/diagnostics/flux_compile_host.py [--height H] [--width W] [--rounds N]
       [--reps N]"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import flux  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    from kiln.patching import flux_block

    model = flux.build_model("dev")
    kwargs = flux.build_inputs(dict(model.config), args.height, args.width)
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    fits_double = flux_block._fits_double

    def timed(name):
        torch._dynamo.reset()
        _, undo = common.compile_blocks(blocks)(model)
        with torch.no_grad():
            t = common.model_times(lambda: model(**kwargs), 3, args.reps)
        undo()
        torch._dynamo.reset()
        print(f"{name}: {t['ms']:.2f} ms, host {t['host_ms']:.2f} ms", flush=True)

    for _ in range(args.rounds):
        timed("compile")
        kiln.patch(model)
        timed("compile + kiln")
        flux_block._fits_double = lambda *a: not torch.compiler.is_compiling() and fits_double(*a)
        try:
            timed("compile + kiln, double blocks left to Inductor")
        finally:
            flux_block._fits_double = fits_double
        kiln.unpatch(model)


if __name__ == "__main__":
    main()

"""Qwen-Image's and Qwen-Image 2.1's compiled settings timed in one process: torch.compile by
block of the unpatched model and of the patched model three ways (as kiln.patch leaves it; with
the blocks' norms torch's instead of kiln's; with the blocks' seams the other way round, kiln's
traced into the graphs where kiln.patch leaves them to Inductor and the other way), in turn,
`--rounds` times. Prints ms per forward (median) and host ms.

Usage: python bench/diagnostics/qwen_compile.py [--model qwen-image|qwen-image21|both] [--rounds N]
       [--reps N] [--layers N]"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import qwen_image  # noqa: E402
import qwen_image21  # noqa: E402


def _model(name, layers):
    if name == "qwen-image":
        model = qwen_image.build_model(layers or 10)
        kwargs, _ = qwen_image.inputs(model, 1024)
    else:
        model = qwen_image21.build_model(layers)
        kwargs, _, _ = qwen_image21.inputs(model, 1024)
    return model, kwargs


def run(name, kiln, rounds, reps, layers):
    from kiln.patching import qwen_image as patch_qwen_image
    from kiln.patching import qwen_image21 as patch_qwen_image21

    patching = patch_qwen_image if name == "qwen-image" else patch_qwen_image21
    norms = patching._NORMS if name == "qwen-image" else patching.NORMS
    model, kwargs = _model(name, layers)
    blocks = list(model.transformer_blocks)

    def timed(setting):
        torch._dynamo.reset()
        _, undo = common.compile_blocks(blocks)(model)
        with torch.no_grad():
            t = common.model_times(lambda: model(**kwargs), 3, reps)
        undo()
        torch._dynamo.reset()
        print(f"{name}: {setting}: {t['ms']:.2f} ms, host {t['host_ms']:.2f} ms", flush=True)

    fits, takes = patching._fits, patching._takes

    def other_way(module, *args):
        # Qwen-Image's per-sample seams are kiln's under compile, Qwen-Image 2.1's diffusers'.
        compiled_kiln = name == "qwen-image"
        return takes(module, *args) and (not torch.compiler.is_compiling() or not compiled_kiln)

    for _ in range(rounds):
        timed("compile")
        kiln.patch(model)
        timed("compile + kiln")
        for block in blocks:
            for norm in norms:
                kiln.unpatch(getattr(block, norm))
        timed("compile + kiln, the blocks' norms torch's")
        kiln.unpatch(model)
        kiln.patch(model)
        patching._fits = other_way
        try:
            timed("compile + kiln, the blocks' seams the other way")
        finally:
            patching._fits = fits
        kiln.unpatch(model)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("qwen-image", "qwen-image21", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=0, help="blocks (0: Qwen-Image 10, Qwen-Image 2.1 all 32)")
    args = parser.parse_args()
    kiln = common.fresh_kiln(1024)
    for name in ("qwen-image", "qwen-image21") if args.model == "both" else (args.model,):
        run(name, kiln, args.rounds, args.reps, args.layers)


if __name__ == "__main__":
    main()

"""kiln beside Liger-Kernel, the Triton kernels LLM trainers drop in for the same ops (its
autograd Functions, called as its module wrappers call them), forward and backward, bf16, in
one run, with a copy of the same bytes timed in the same rounds.

Ops (Liger's Function in brackets): rms_norm (LigerRMSNormFunction, Llama casting),
fused_add_rms_norm (LigerFusedAddRMSNormFunction), layer_norm (LigerLayerNormFunction),
adaln per token and per sample (LigerModulatedRMSNormFunction: RMSNorm without weight, then
* (1 + scale) + shift; both sides get the same contiguous scale and shift, no table),
swiglu (LigerSiLUMulFunction), geglu (LigerGELUMulFunction, tanh) and rope
(LigerRopeFunction: half-split, q and k laid out as transformers makes them, [B, S, H, D] in
memory and viewed as [B, H, S, D]; Liger rotates them in place, kiln writes new tensors: the
same bytes).

The backward pass is one torch.autograd.grad over a graph built once, every input and
parameter trained; Liger's backward may overwrite its dy (its default), so each side has its
own. "MB" counts what each pass must move: inputs read and outputs written once.

Skips (exit 0, saying so) where liger_kernel is not installed.

Usage: python bench/libraries.py [--out DIR] [--quick] [--ops a,b] [--tag=-name]
Writes DIR/libraries-<date>-<device>.json and .md; prints the table last."""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import rope as rope_bench  # noqa: E402

BF16 = torch.bfloat16
EPS = 1e-6
NORM_HIDDEN = [2048, 4096, 8192]
NORM_ROWS = [1, 4096, 16384]
WIDTHS = [14336, 28672]
TOKENS = [1, 4096, 16384]
# (batch, q heads, k heads, sequence, head dim)
ROPE_SHAPES = [(1, 32, 8, 1, 128), (1, 32, 8, 4096, 128), (8, 32, 8, 2048, 128)]
OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "adaln", "adaln_sample", "swiglu", "geglu", "rope"]


def liger_functions():
    """Liger's autograd Functions by op, or None where liger_kernel is not installed."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.modulated_rms_norm import LigerModulatedRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    return {
        "rms_norm": lambda x, w: LigerRMSNormFunction.apply(x, w, EPS),
        "fused_add_rms_norm": lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS),
        "layer_norm": lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS),
        # Liger broadcasts a [B, H] modulation over [B, T, H] rows, and takes [N, H] per token.
        "adaln": lambda x, scale, shift: LigerModulatedRMSNormFunction.apply(
            x, None, scale.reshape(-1, x.shape[-1]), shift.reshape(-1, x.shape[-1]), EPS),
        "swiglu": lambda g, u: LigerSiLUMulFunction.apply(g, u),
        "geglu": lambda g, u: LigerGELUMulFunction.apply(g, u),
        "rope": lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin),
    }


def rand(*shape, scale=1.0):
    return (torch.randn(shape, device="cuda") * scale).to(BF16)


def shapes(op, quick):
    if op == "rope":
        return ROPE_SHAPES[:2] if quick else ROPE_SHAPES
    if op in ("swiglu", "geglu"):
        return [(t, w) for t in (TOKENS[:2] if quick else TOKENS) for w in (WIDTHS[:1] if quick else WIDTHS)]
    return [(r, h) for r in (NORM_ROWS[:2] if quick else NORM_ROWS) for h in (NORM_HIDDEN[1:2] if quick else NORM_HIDDEN)]


def make_case(op, shape, kiln):
    """(kiln forward, Liger forward, inputs (every one trained in the backward), forward
    bytes, backward bytes, shape label)."""
    if op == "rope":
        b, hq, hk, s, d = shape
        q = rand(b, s, hq, d).transpose(1, 2)
        k = rand(b, s, hk, d).transpose(1, 2)
        cos, sin = rope_bench.llama_table(1, s, d)  # [1, S, D], as transformers makes them
        qk = 2 * (q.numel() + k.numel()) * 2
        table = 2 * cos.numel() * 2
        label = f"q[{b},{hq},{s},{d}] k[{b},{hk},{s},{d}]"
        return ((lambda q, k: kiln.rope(q, k, cos, sin)), (lambda q, k: LIGER["rope"](q, k, cos, sin)),
                (q, k), qk + table, qk + table, label)
    if op in ("swiglu", "geglu"):
        tokens, width = shape
        g, u = rand(tokens, width), rand(tokens, width)
        n = g.numel() * 2
        mine = kiln.swiglu if op == "swiglu" else kiln.geglu
        return mine, LIGER[op], (g, u), 3 * n, 5 * n, f"{tokens}x{width}"
    rows, hidden = shape
    x = rand(rows, hidden)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    size = x.numel() * 2
    label = f"{rows}x{hidden}"
    if op == "rms_norm":
        return (lambda x, w: kiln.rms_norm(x, w, EPS)), LIGER[op], (x, w), 2 * size, 3 * size, label
    if op == "fused_add_rms_norm":
        r = rand(rows, hidden)
        return ((lambda x, r, w: kiln.fused_add_rms_norm(x, r, w, EPS)), LIGER[op], (x, r, w),
                4 * size, 4 * size, label)
    if op == "layer_norm":
        bias = rand(hidden, scale=0.1)
        return ((lambda x, w, b: kiln.layer_norm(x, w, b, EPS)), LIGER[op], (x, w, bias),
                2 * size, 3 * size, label)
    # adaln: x [1, T, D] with [1, T, D] operands, or (adaln_sample) [2, T/2, D] with [2, 1, D].
    per_sample = op == "adaln_sample"
    batch = 2 if per_sample and rows % 2 == 0 else 1
    x3 = x.view(batch, rows // batch, hidden)
    operand = (batch, 1 if per_sample else rows // batch, hidden)
    scale, shift = rand(*operand, scale=0.3), rand(*operand, scale=0.3)
    operand_bytes = 0 if per_sample else size
    return ((lambda x, scale, shift: kiln.adaln(x, scale, shift, None, EPS, "rms")), LIGER["adaln"],
            (x3, scale, shift), 2 * size + 2 * operand_bytes, 3 * size + 3 * operand_bytes,
            f"{rows}x{hidden}")


def first(out):
    return out[0] if isinstance(out, tuple) else out


def rel_diff(a, b):
    a, b = first(a).double(), first(b).double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def backward_calls(fn, inputs, seed):
    """A torch.autograd.grad of fn's outputs over trainable copies of `inputs` (graph built
    once), and the gradients of one call (for the comparison)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    # Liger's rope rotates its inputs in place: give it non-leaf views, as a model's q and k are.
    outputs = fn(*[t.view_as(t) for t in leaves])
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    # The same values for both sides, each in its output's layout, as the layers after it
    # hand gradients back.
    grads = [torch.empty_like(o).copy_(torch.randn(o.shape, device="cuda", generator=generator))
             for o in outputs]
    call = lambda: torch.autograd.grad(outputs, leaves, grads, retain_graph=True)  # noqa: E731
    return call, call()


def measure(kiln_fn, liger_fn, moved):
    times = common.bench_side_by_side({"kiln": kiln_fn, "liger": liger_fn, "copy": common.same_bytes_copy(moved)})
    return {k: v * 1e3 for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="two shapes an op")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--tag", default="", help="appended to the output file names")
    args = parser.parse_args()
    if LIGER is None:
        print("libraries: liger_kernel is not installed; nothing to compare (pip install liger-kernel)")
        return

    from importlib.metadata import version

    kiln = common.fresh_kiln(1024)
    env = common.environment()
    env["versions"]["liger_kernel"] = version("liger-kernel")
    copy_gbs = common.copy_bandwidth_gbs()
    tune_dir, seen = common.tune_dir(kiln), set()
    results = []
    for op in args.ops.split(","):
        for shape in shapes(op, args.quick):
            mine, theirs, inputs, forward_bytes, backward_bytes, label = make_case(op, shape, kiln)
            if op == "rope":
                # Liger rotates in place: it is timed on copies of its own (rotating them again
                # and again moves the same bytes) and compared on fresh ones. clone() keeps
                # the [B, S, H, D] layout.
                own = [t.clone() for t in inputs]
                liger_forward = lambda: theirs(*own)  # noqa: E731
                liger_once = lambda: theirs(*[t.clone() for t in inputs])  # noqa: E731
            else:
                liger_forward = liger_once = lambda: theirs(*inputs)  # noqa: E731
            with torch.no_grad():
                fwd = measure(lambda: mine(*inputs), liger_forward, forward_bytes)
                forward_diff = rel_diff(mine(*inputs), liger_once())
            kiln_bwd, kiln_grads = backward_calls(mine, inputs, seed=1)
            liger_bwd, liger_grads = backward_calls(theirs, inputs, seed=1)
            backward_diff = max(rel_diff(a, b) for a, b in zip(kiln_grads, liger_grads))
            bwd = measure(kiln_bwd, liger_bwd, backward_bytes)
            tuned = common.tuned_configs(tune_dir, seen)
            for direction, times, moved, diff in (("forward", fwd, forward_bytes, forward_diff),
                                                  ("backward", bwd, backward_bytes, backward_diff)):
                copy_us = times.pop("copy")
                results.append({
                    "op": op, "pass": direction, "shape": label, "bytes": moved, "us": times,
                    "copy_same_bytes_us": copy_us,
                    "pct_of_copy": {k: 100 * moved / (v * 1e-6) / 1e9 / copy_gbs for k, v in times.items()},
                    "kiln_vs_liger": times["liger"] / times["kiln"],
                    "rel_diff_kiln_liger": diff,
                    "kiln_tuned_in_case": tuned,  # forward's and backward's tunes alike
                })
                r = results[-1]
                print(f"{op} {direction} {label}: kiln {times['kiln']:.1f} us, liger {times['liger']:.1f} us, "
                      f"{r['kiln_vs_liger']:.2f}x, copy {copy_us:.1f} us, rel diff {diff:.1e}", flush=True)
            del kiln_bwd, liger_bwd, kiln_grads, liger_grads, inputs
            common.write_json(os.path.join(args.out, f"libraries-partial{args.tag}.json"),
                              {"environment": env, "copy_gbs": copy_gbs, "results": results})
    write(args, env, copy_gbs, results, kiln)


def write(args, env, copy_gbs, results, kiln):
    ratios = {}
    for r in results:
        ratios.setdefault((r["op"], r["pass"]), []).append(r["kiln_vs_liger"])
    means = {key: math.exp(sum(map(math.log, v)) / len(v)) for key, v in ratios.items()}
    stamp = f"{common.stamp(env)}{args.tag}"
    common.write_json(os.path.join(args.out, f"libraries-{stamp}.json"), {
        "environment": env, "copy_gbs": copy_gbs, "results": results, "kiln_settings": kiln.settings(),
        "geomean_kiln_vs_liger": {f"{op} {p}": mean for (op, p), mean in means.items()}})
    lines = [
        f"kiln beside Liger-Kernel {env['versions']['liger_kernel']}, bf16, {env['device']} ({env['sm']}), "
        f"{env['date']}, torch {env['versions']['torch']}, triton {env['versions'].get('triton', '-')}; "
        f"copy {copy_gbs:.0f} GB/s. us (% of copy)",
        "",
        "| op | pass | shape | MB | kiln | Liger | kiln vs Liger | copy of same MB | rel diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        us, pct = r["us"], r["pct_of_copy"]
        lines.append(f"| {r['op']} | {r['pass']} | {r['shape']} | {r['bytes'] / 1e6:.1f} "
                     f"| {us['kiln']:.1f} ({pct['kiln']:.0f}%) | {us['liger']:.1f} ({pct['liger']:.0f}%) "
                     f"| {r['kiln_vs_liger']:.2f}x | {r['copy_same_bytes_us']:.1f} | {r['rel_diff_kiln_liger']:.1e} |")
    lines += ["", "| op | pass | geomean kiln vs Liger | min | max |", "| --- | --- | --- | --- | --- |"]
    for (op, p), v in ratios.items():
        lines.append(f"| {op} | {p} | {means[op, p]:.2f}x | {min(v):.2f}x | {max(v):.2f}x |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"libraries-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


LIGER = liger_functions()

if __name__ == "__main__":
    main()

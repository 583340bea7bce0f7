"""The normalisation family: kiln beside the eager module, the matching torch.nn.functional
op and torch.compile of the eager module, in one run, bf16, on the grid of hidden sizes x
rows of the norm issue (and the targets' shapes), with % of the copy bandwidth measured in
the same run.

Ops: rms_norm (weight), fused_add_rms_norm (weight), layer_norm (weight and bias),
adaln (LTX-Video: RMSNorm without weight, per-token scale/shift from table + temb),
gated_adaln (the LTX-Video block seam: h + y * gate, then the AdaLN of the new h), and
adaln_sample / gated_adaln_sample: the same with one timestep per sample (batch 2, operands
[2, 1, D]), as LTX-Video's text-to-video pipeline and FLUX call them (not run by default).

With --backward, the backward passes instead (training): each column is one
torch.autograd.grad over a graph built once (kiln's registered autograd formula and its
backward kernel; F's autograd; torch.compile's generated backward), for rms_norm,
fused_add_rms_norm, layer_norm and adaln (and adaln_sample, FLUX's per-sample LayerNorm
form, not run by default); "MB" counts what the norm's backward itself must move (x, dy, the
gradients of the residual or modulation operands, dx, dscale). --frozen freezes the norms'
parameters and the modulation (LoRA fine-tuning), so only the input's gradient is asked for.

Usage: python bench/norms.py [--out DIR] [--quick] [--backward [--frozen]] [--ops a,b] [--hidden a,b] [--rows a,b]
Writes DIR/norms-<date>-<device>.json and .md (norms-backward-... with --backward); prints
the table last."""

import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

HIDDEN = [1536, 2048, 2432, 3072, 3584, 4096, 4544, 5120, 8192, 14848]
ROWS = [1, 128, 2688, 8192, 32768]
QUICK_HIDDEN = [2048, 4096, 14848]
QUICK_ROWS = [1, 2688, 16384]
OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "adaln", "gated_adaln"]
EPS = 1e-6


def llama_rms_norm(x, w):
    """transformers' LlamaRMSNorm.forward (fp32 upcast, cast back before the weight)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(dtype)


def diffusers_rms_norm(x):
    """diffusers' RMSNorm(elementwise_affine=False).forward."""
    dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + EPS)).to(dtype)


def make_case(op, rows, hidden, kiln, dt=torch.bfloat16):
    """(kiln fn, {peer name: fn}, eager fn to compile, bytes that must move)."""
    dev = "cuda"
    x = torch.randn(rows, hidden, device=dev, dtype=dt)
    w = (1 + 0.1 * torch.randn(hidden, device=dev)).to(dt)
    size = x.numel() * x.element_size()
    if op == "rms_norm":
        eager = lambda: llama_rms_norm(x, w)  # noqa: E731
        return (lambda: kiln.rms_norm(x, w, EPS),
                {"F": lambda: F.rms_norm(x, (hidden,), w, EPS), "eager": eager}, eager, 2 * size)
    if op == "fused_add_rms_norm":
        r = torch.randn_like(x)

        def eager():
            s = x + r
            return llama_rms_norm(s, w), s
        return (lambda: kiln.fused_add_rms_norm(x, r, w, EPS),
                {"F": lambda: F.rms_norm(x + r, (hidden,), w, EPS), "eager": eager}, eager, 4 * size)
    if op == "layer_norm":
        b = torch.randn(hidden, device=dev, dtype=dt)
        eager = lambda: F.layer_norm(x, (hidden,), w, b, EPS)  # noqa: E731
        return (lambda: kiln.layer_norm(x, w, b, EPS), {"F": eager}, eager, 2 * size)
    # The DiT ops: x as [1, T, D] with per-token operands from a [1, T, 6D] temb, or (the
    # _sample forms) as [2, T/2, D] with one [2, 1, 6D] temb row per sample.
    per_sample = op.endswith("_sample")
    op = op.removesuffix("_sample")
    batch = 2 if per_sample and rows % 2 == 0 else 1
    x3 = x.view(batch, rows // batch, hidden)
    temb = torch.randn(batch, 1 if per_sample else rows, 6 * hidden, device=dev, dtype=dt) * 0.3
    table = torch.randn(6, hidden, device=dev, dtype=dt) * 0.3
    ada = kiln.ada_values(temb, 6)
    if op == "adaln":
        def eager():
            values = table[None, None] + temb.reshape(batch, temb.shape[1], 6, hidden)
            shift, scale = values[:, :, 0], values[:, :, 1]
            return diffusers_rms_norm(x3) * (1 + scale) + shift
        return (lambda: kiln.adaln(x3, ada[:, :, 1], ada[:, :, 0], None, EPS, "rms", table[1], table[0]),
                {"eager": eager}, eager, (2 if per_sample else 4) * size)
    if op == "gated_adaln":
        y = torch.randn_like(x3)

        def eager():
            values = table[None, None] + temb.reshape(batch, temb.shape[1], 6, hidden)
            shift, scale, gate = values[:, :, 0], values[:, :, 1], values[:, :, 2]
            h = x3 + y * gate
            return h, diffusers_rms_norm(h) * (1 + scale) + shift
        return (lambda: kiln.gated_adaln(x3, y, ada[:, :, 2], ada[:, :, 1], ada[:, :, 0], None, EPS, "rms",
                                         table[2], table[1], table[0]),
                {"eager": eager}, eager, (4 if per_sample else 7) * size)
    raise ValueError(op)


BACKWARD_OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "adaln"]


def make_backward_case(op, rows, hidden, kiln, frozen=False, dt=torch.bfloat16, compiled=True):
    """(kiln fn, {peer name: fn}, bytes that must move): each fn is one backward pass of the
    op, torch.autograd.grad over a forward graph built here once, for every input that
    requires grad. With `frozen`, the norm's parameters and the modulation do not (LoRA
    fine-tuning): the gradient is the input's alone, for kiln and the peers alike. Without
    `compiled`, the torch.compile peer is left out (compiling it takes seconds)."""
    dev = "cuda"
    trained = not frozen
    x = torch.randn(rows, hidden, device=dev, dtype=dt).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(hidden, device=dev)).to(dt).requires_grad_(trained)
    dy = torch.randn_like(x)
    size = x.numel() * x.element_size()

    def grad_of(outputs, inputs, grads):
        wanted = [t for t in inputs if t.requires_grad]
        return lambda: torch.autograd.grad(outputs, wanted, grads, retain_graph=True)

    def cases(kiln_fn, peer_fn, inputs, grads, moved):
        peers = {"F": grad_of(peer_fn(*inputs), inputs, grads)}
        if compiled:
            peers["compiled"] = grad_of(torch.compile(peer_fn, dynamic=False)(*inputs), inputs, grads)
        return grad_of(kiln_fn(*inputs), inputs, grads), peers, moved

    if op == "rms_norm":
        return cases(lambda x, w: kiln.rms_norm(x, w, EPS), lambda x, w: F.rms_norm(x, (hidden,), w, EPS),
                     (x, w), dy, 3 * size)
    if op == "fused_add_rms_norm":
        r = torch.randn_like(x).requires_grad_(True)

        def peer(x, r, w):
            s = x + r
            return F.rms_norm(s, (hidden,), w, EPS), s
        return cases(lambda x, r, w: kiln.fused_add_rms_norm(x, r, w, EPS), peer, (x, r, w),
                     (dy, torch.randn_like(dy)), 4 * size)
    if op == "layer_norm":
        b = torch.randn(hidden, device=dev, dtype=dt).requires_grad_(trained)
        return cases(lambda x, w, b: kiln.layer_norm(x, w, b, EPS), lambda x, w, b: F.layer_norm(x, (hidden,), w, b, EPS),
                     (x, w, b), dy, 3 * size)
    if op == "adaln":  # LTX-Video: RMSNorm without weight, per-token scale/shift from table + temb
        x3 = x.detach().view(1, rows, hidden).requires_grad_(True)
        temb = (torch.randn(1, rows, 6 * hidden, device=dev, dtype=dt) * 0.3).requires_grad_(trained)
        table = (torch.randn(6, hidden, device=dev, dtype=dt) * 0.3).requires_grad_(trained)

        def mine(x3, temb, table):
            # unbind, as ada_values' docs ask under autograd (one stack for temb's gradient).
            shift, scale = kiln.ada_values(temb, 6).unbind(2)[:2]
            table_shift, table_scale = table.unbind(0)[:2]
            return kiln.adaln(x3, scale, shift, None, EPS, "rms", table_scale, table_shift)

        def peer(x3, temb, table):
            values = table[None, None] + temb.reshape(1, rows, 6, hidden)
            shift, scale = values[:, :, 0], values[:, :, 1]
            return diffusers_rms_norm(x3) * (1 + scale) + shift
        # x, dy and scale read, dx written; dscale written where temb is trained.
        return cases(mine, peer, (x3, temb, table), dy.view(1, rows, hidden), (5 if trained else 4) * size)
    if op == "adaln_sample":  # FLUX's AdaLayerNormZero: LayerNorm without affine, [B, 1, D] operands
        batch = 2 if rows % 2 == 0 else 1
        x3 = x.detach().view(batch, rows // batch, hidden).requires_grad_(True)
        emb = (torch.randn(batch, 6 * hidden, device=dev, dtype=dt) * 0.3).requires_grad_(trained)

        def mine(x3, emb):
            shift, scale = emb.chunk(6, dim=1)[:2]
            return kiln.adaln(x3, scale[:, None], shift[:, None], None, EPS, "layer")

        def peer(x3, emb):
            shift, scale = emb.chunk(6, dim=1)[:2]
            return F.layer_norm(x3, (hidden,), eps=EPS) * (1 + scale[:, None]) + shift[:, None]
        return cases(mine, peer, (x3, emb), dy.view(batch, rows // batch, hidden), 3 * size)
    raise ValueError(op)


def chosen_config(cache_dir, op, hidden, since, dtype_key="bf16"):
    """The winner kiln's tuner stored for this shape (the newest tuning record of the op and
    hidden size written since `since`, not the backward's partial sums', flags 8192), as its
    config key, or "-"."""
    best = None
    for path in glob.glob(os.path.join(cache_dir, "v1", "tune", "*", f"{op}.{dtype_key}.h{hidden}.*.json")):
        if ".f8192." in os.path.basename(path):
            continue
        mtime = os.path.getmtime(path)
        if mtime >= since and (best is None or mtime > best[0]):
            best = (mtime, path)
    if best is None:
        return "-"
    with open(best[1]) as f:
        winner = json.load(f).get("winner", {})
    key = f"v{winner.get('vec_bytes')}.t{winner.get('threads_per_row')}.c{winner.get('cta_threads')}"
    for name, value in sorted(winner.get("extra", {}).items()):
        key += f".{name}={value}"
    return key




def copy_us(moved):
    """The time of a copy of the same bytes (common.same_bytes_copy)."""
    return common.bench_side_by_side({"copy": common.same_bytes_copy(moved)})["copy"] * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a 3 x 3 corner of the grid")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--hidden", default=None)
    parser.add_argument("--rows", default=None)
    parser.add_argument("--tag", default="", help="appended to the output file names")
    parser.add_argument("--backward", action="store_true", help="time the backward passes (training)")
    parser.add_argument("--frozen", action="store_true",
                        help="with --backward: parameters and modulation frozen, the input's gradient only (LoRA)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(common.DTYPE_KEYS))
    args = parser.parse_args()
    dt, dtype_key = getattr(torch, args.dtype), common.DTYPE_KEYS[args.dtype]
    if dt != torch.bfloat16:
        args.tag = f"-{dtype_key}{args.tag}"
    if args.backward:
        args.tag = ("-backward-frozen" if args.frozen else "-backward") + args.tag
        if args.ops == ",".join(OPS):
            args.ops = ",".join(BACKWARD_OPS)

    kiln = common.fresh_kiln(1024)
    hiddens = [int(v) for v in args.hidden.split(",")] if args.hidden else (QUICK_HIDDEN if args.quick else HIDDEN)
    row_counts = [int(v) for v in args.rows.split(",")] if args.rows else (QUICK_ROWS if args.quick else ROWS)
    ops = args.ops.split(",")

    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    results = []
    for op in ops:
        for hidden in hiddens:
            for rows in row_counts:
                started = time.time() - 1
                if args.backward:
                    fn, peers, moved = make_backward_case(op, rows, hidden, kiln, args.frozen, dt)
                    eager = compiled = None
                else:
                    fn, peers, eager, moved = make_case(op, rows, hidden, kiln, dt)
                    compiled = torch.compile(eager, dynamic=False)
                with torch.no_grad():  # bench_side_by_side's first calls compile and tune
                    contenders = {"kiln": fn, **peers}
                    if compiled is not None:
                        contenders["compiled"] = compiled
                    times = common.bench_side_by_side(contenders)
                best = min(v for k, v in times.items() if k != "kiln")
                results.append({
                    "op": op, "rows": rows, "hidden": hidden, "bytes": moved,
                    "us": {k: v * 1e3 for k, v in times.items()},
                    "pct_of_copy": {k: 100 * moved / (v * 1e-3) / 1e9 / copy_gbs for k, v in times.items()},
                    "speedup_vs_best_peer": best / times["kiln"],
                    "best_peer": min((v, k) for k, v in times.items() if k != "kiln")[1],
                    "kiln_config": chosen_config(os.environ["KILN_CACHE_DIR"],
                                                 op.removesuffix("_sample") + ("_backward" if args.backward else ""),
                                                 hidden, started, dtype_key),
                    "copy_same_bytes_us": copy_us(moved),
                })
                r = results[-1]
                print(f"{op} {rows}x{hidden}: kiln {r['us']['kiln']:.1f} us ({r['pct_of_copy']['kiln']:.0f}%), "
                      f"best peer {r['best_peer']} {best * 1e3:.1f} us, {r['speedup_vs_best_peer']:.2f}x", flush=True)
                torch._dynamo.reset()
                del fn, peers, eager, compiled
                # Written after every shape, so a run stopped at its time limit keeps what it measured.
                common.write_json(os.path.join(args.out, f"norms-partial{args.tag}.json"),
                                  {"environment": env, "copy_gbs": copy_gbs, "results": results})

    summary = {}
    for op in ops:
        mine = [r for r in results if r["op"] == op]
        big = [r["pct_of_copy"]["kiln"] for r in mine if r["bytes"] >= 128e6]
        mid = [r["pct_of_copy"]["kiln"] for r in mine if 20e6 <= r["bytes"] < 128e6]
        summary[op] = {
            "geomean_speedup": math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in mine) / len(mine)),
            "min_speedup": min(r["speedup_vs_best_peer"] for r in mine),
            "min_pct_of_copy_ge_128MB": min(big) if big else None,
            "min_pct_of_copy_20_128MB": min(mid) if mid else None,
        }
    document = {"environment": env, "copy_gbs": copy_gbs, "results": results, "summary": summary,
                "kiln_settings": kiln.settings()}
    stamp = f"{common.stamp(env)}{args.tag}"
    title = "Norm family" if not args.backward else (
        "Norm family backward, parameters and modulation frozen (one torch.autograd.grad of the input)"
        if args.frozen else "Norm family backward (one torch.autograd.grad)")
    common.write_json(os.path.join(args.out, f"norms-{stamp}.json"), document)

    lines = [
        f"{title}, {dtype_key}, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}, "
        f"triton {env['versions'].get('triton', '-')}; copy {copy_gbs:.0f} GB/s. us (% of copy); peers: "
        + ("F = autograd of the torch.nn.functional op (adaln: of the module's formula), compiled = the backward "
         "torch.compile(dynamic=False) generates for it" if args.backward else
         "F = torch.nn.functional op, eager = the module's formula, compiled = torch.compile(eager, dynamic=False)"),
        "",
        "| op | rows x hidden | MB | kiln | F | eager | compiled | kiln vs best | copy of same MB | kiln config |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        us, pct = r["us"], r["pct_of_copy"]
        cell = lambda k: f"{us[k]:.1f} ({pct[k]:.0f}%)" if k in us else "-"  # noqa: E731
        lines.append(f"| {r['op']} | {r['rows']}x{r['hidden']} | {r['bytes'] / 1e6:.1f} | {cell('kiln')} | {cell('F')} "
                     f"| {cell('eager')} | {cell('compiled')} | {r['speedup_vs_best_peer']:.2f}x "
                     f"| {r['copy_same_bytes_us']:.1f} | {r['kiln_config']} |")
    lines += ["", "| op | geomean vs best peer | min vs best | min % copy (>=128 MB) | min % copy (20-128 MB) |",
              "| --- | --- | --- | --- | --- |"]
    fmt = lambda v: "-" if v is None else f"{v:.0f}%"  # noqa: E731
    for op, s in summary.items():
        lines.append(f"| {op} | {s['geomean_speedup']:.2f}x | {s['min_speedup']:.2f}x | "
                     f"{fmt(s['min_pct_of_copy_ge_128MB'])} | {fmt(s['min_pct_of_copy_20_128MB'])} |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"norms-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

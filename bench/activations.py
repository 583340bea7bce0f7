"""Activations: kiln's swiglu, geglu, gelu, gated_residual and clamped_swiglu beside the eager formula and
torch.compile of it (dynamic=False), bf16, on the issue's grid of tokens x widths; with the
copy-bandwidth ceiling measured in the same run and the host overhead of one call. At the
launch-bound token counts (<= LAUNCH_BOUND_TOKENS) each contender is also timed the way a
model without CUDA graphs runs it: calls back to back, host wall time per call, so the host's
cost of issuing a call counts where it exceeds the kernel's.

Usage: python bench/activations.py [--out DIR] [--quick] [--forms swiglu,gelu,...]
                                   [--tokens 1,128] [--widths 768,8192]
GPT-OSS's expert gate: --forms clamped_swiglu --tokens 4,128,4096,16384 --widths 2880 (routed
rows: four experts a token).
Writes DIR/activations-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

TOKENS = [1, 128, 4096, 16384]
WIDTHS = [8192, 8960, 11008, 12288, 13824, 14336, 18944, 28672]
QUICK_TOKENS = [1, 128, 4096]
QUICK_WIDTHS = [8192, 14336, 28672]
LAUNCH_BOUND_TOKENS = 128


def eager_swiglu(gate, up):
    return F.silu(gate) * up


def eager_swiglu_packed(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def eager_geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def eager_gelu(x):
    return F.gelu(x, approximate="tanh")


def eager_gated_residual(h, y, gate):
    return h + y * gate


def eager_clamped_swiglu(gate_up, alpha=1.702, limit=7.0):
    """GPT-OSS's expert gate as transformers writes it (GptOssExperts._apply_gate)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def make_form(name, tokens, width, dtype=torch.bfloat16):
    """(kiln call, eager function, its arguments, bytes that must move)."""
    import kiln

    def r(*shape):
        return torch.randn(shape, device="cuda", dtype=dtype)

    size = torch.finfo(dtype).bits // 8
    n = tokens * width * size  # bytes of one [tokens, width] tensor
    if name == "swiglu":
        g, u = r(tokens, width), r(tokens, width)
        return (lambda: kiln.swiglu(g, u)), eager_swiglu, (g, u), 3 * n
    if name == "swiglu_packed":
        p = r(tokens, 2 * width)
        return (lambda: kiln.swiglu(p)), eager_swiglu_packed, (p,), 3 * n
    if name == "clamped_swiglu":  # GPT-OSS's routed gate_up, values across its clamps at +-7
        p = r(tokens, 2 * width) * 7
        return (lambda: kiln.clamped_swiglu(p)), eager_clamped_swiglu, (p,), 3 * n
    if name == "geglu":
        g, u = r(tokens, width), r(tokens, width)
        return (lambda: kiln.geglu(g, u)), eager_geglu, (g, u), 3 * n
    if name == "gelu":
        x = r(tokens, width)
        return (lambda: kiln.gelu(x)), eager_gelu, (x,), 2 * n
    if name == "gated_residual":  # DiT: [B, T, D] with a gate per sample
        batch = 2 if tokens % 2 == 0 else 1
        h, y = r(batch, tokens // batch, width), r(batch, tokens // batch, width)
        gate = r(batch, 1, width)
        return (lambda: kiln.gated_residual(h, y, gate)), eager_gated_residual, (h, y, gate), \
            3 * n + gate.numel() * size
    raise ValueError(f"unknown form {name}")


def write_results(args, env, copy_gbs, rows, overhead, kiln):
    """Written after every form, so a run cut short keeps what it measured."""
    result = {"environment": env, "copy_gbs": copy_gbs, f"activations_{args.dtype_key}": rows,
              "host_overhead_us": overhead, "kiln_settings": kiln.settings(),
              "kiln_device": kiln.device_info(0)}
    stamp = f"{common.stamp(env)}{args.tag}"
    common.write_json(os.path.join(args.out, f"activations-{stamp}.json"), result)

    lines = [
        f"Activations {args.dtype_key}, {env['device']} ({env['sm']}), {env['date']}, torch "
        f"{env['versions']['torch']}, triton {env['versions'].get('triton', '-')}; copy {copy_gbs:.0f} GB/s",
        "",
        "| op | tokens x width | MB moved | kiln us (% copy) | eager us | torch.compile us (% copy) "
        "| kiln vs best | per block (min-max) | copy of same MB us | max rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        blocks = r.get("speedup_per_block")
        spread = f"{min(blocks):.2f}-{max(blocks):.2f}x" if blocks else "-"
        lines.append(
            f"| {r['form']} | {r['tokens']}x{r['width']} | {r['bytes'] / 1e6:.1f} "
            f"| {us['kiln']:.1f} ({pct['kiln']:.0f}%) | {us['eager']:.1f} "
            f"| {us['compiled']:.1f} ({pct['compiled']:.0f}%) | {r['speedup_vs_best_peer']:.2f}x "
            f"| {spread} | {r['copy_same_bytes_us']:.1f} | {r['max_rel_err_vs_fp64']:.1e} |")
    launch_bound = [r for r in rows if "back_to_back_us" in r]
    if launch_bound:
        lines += ["", "Launch-bound shapes, calls back to back (host wall time per call, us: what "
                  "a model without CUDA graphs pays):", "",
                  "| op | tokens x width | kiln | eager | torch.compile | kiln vs best |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in launch_bound:
            b = r["back_to_back_us"]
            lines.append(f"| {r['form']} | {r['tokens']}x{r['width']} | {b['kiln']:.1f} "
                         f"| {b['eager']:.1f} | {b['compiled']:.1f} "
                         f"| {r['back_to_back_speedup']:.2f}x |")
    slower = [r for r in rows if r["speedup_vs_best_peer"] < 1.0]
    every_block = [r for r in rows if "speedup_per_block" in r and max(r["speedup_per_block"]) < 1.0]
    lines += ["", f"kiln slower than the best peer on {len(slower)} of {len(rows)} shapes" +
              (": " + ", ".join(f"{r['form']} {r['tokens']}x{r['width']} ({r['speedup_vs_best_peer']:.3f}x)"
                                for r in slower) if slower else ""),
              "", f"Launch-bound shapes slower in every timed block: {len(every_block)}" +
              (": " + ", ".join(f"{r['form']} {r['tokens']}x{r['width']}" for r in every_block)
               if every_block else ""),
              "", "Host overhead per call (1x8192, us): " +
              ", ".join(f"{k} {v:.1f}" for k, v in overhead.items()),
              "", f"The floor of one launch, timed the same way (a 1-element x.add_(1)): "
              f"{env['one_element_add_us']:.1f} us"]
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"activations-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="tokens 1,128,4096 x widths 8192,14336,28672")
    parser.add_argument("--forms", default="swiglu,swiglu_packed,gated_residual,geglu,gelu")
    parser.add_argument("--tokens", help="comma-separated token counts (default: the grid)")
    parser.add_argument("--widths", help="comma-separated widths (default: the grid)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="side-by-side blocks per launch-bound shape (tokens <= 128)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(common.DTYPE_KEYS))
    parser.add_argument("--tag", default="", help="appended to the output file names")
    args = parser.parse_args()
    dtype, args.dtype_key = getattr(torch, args.dtype), common.DTYPE_KEYS[args.dtype]
    if args.dtype_key != "bf16":
        args.tag = f"-{args.dtype_key}{args.tag}"

    kiln = common.fresh_kiln(1024)
    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    tokens_list = QUICK_TOKENS if args.quick else TOKENS
    if args.tokens:
        tokens_list = [int(t) for t in args.tokens.split(",")]
    widths = QUICK_WIDTHS if args.quick else WIDTHS
    if args.widths:
        widths = [int(w) for w in args.widths.split(",")]
    g = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16)
    compiled_swiglu = torch.compile(eager_swiglu, dynamic=False)
    swiglu_op = torch.ops.kiln.swiglu.default
    tiny = torch.zeros(1, device="cuda")
    env["one_element_add_us"] = common.bench_side_by_side({"add_": lambda: tiny.add_(1)})["add_"] * 1e3
    overhead = common.host_side_by_side({
        "x.add(x)": lambda: g.add(g),
        "F.gelu(g)": lambda: F.gelu(g, approximate="tanh"),
        "eager F.silu(g) * u": lambda: eager_swiglu(g, u),
        "torch.compile of it": lambda: compiled_swiglu(g, u),
        "kiln.swiglu": lambda: kiln.swiglu(g, u),
        "kiln.gelu": lambda: kiln.gelu(g),
        "torch.ops.kiln.swiglu.default": lambda: swiglu_op(g, u, False),
    })
    tune_dir = common.tune_dir(kiln)
    seen = set()
    rows = []
    for form in args.forms.split(","):
        compiled = torch.compile(make_form(form, 1, 8, dtype)[1], dynamic=False)
        for tokens in tokens_list:
            for width in widths:
                kiln_call, eager, inputs, moved = make_form(form, tokens, width, dtype)
                with torch.no_grad():
                    expected = eager(*[t.double() for t in inputs])
                    out = kiln_call()
                    err = ((out.double() - expected).abs() /
                           expected.abs().clamp_min(1)).max().item()
                    contenders = {
                        "kiln": kiln_call,
                        "eager": lambda inputs=inputs: eager(*inputs),
                        "compiled": lambda inputs=inputs: compiled(*inputs),
                    }
                    # Launch-bound shapes run a few microseconds, a handful of the event
                    # timer's 32 ns steps apart, and one side-by-side block's medians move by
                    # up to 3% from block to block: they are timed in several blocks (each
                    # its own shuffle), and each contender's time is its median block.
                    launch_bound = tokens <= LAUNCH_BOUND_TOKENS
                    blocks = [common.bench_side_by_side(
                        {**contenders, "copy": common.same_bytes_copy(moved)}, seed=seed)
                        for seed in range(args.repeats if launch_bound else 1)]
                    times = {k: statistics.median(b[k] for b in blocks) for k in blocks[0]}
                    back_to_back = {}
                    if launch_bound:
                        back_to_back = common.host_side_by_side(contenders, calls=100, rounds=9)
                copy_ms = times.pop("copy")
                best_peer = min(times["eager"], times["compiled"])
                record = {
                    "form": form, "tokens": tokens, "width": width, "bytes": moved,
                    "us": {k: v * 1e3 for k, v in times.items()},
                    "copy_same_bytes_us": copy_ms * 1e3,
                    "pct_of_copy": {k: 100 * moved / (v * 1e-3) / 1e9 / copy_gbs
                                    for k, v in times.items()},
                    "speedup_vs_best_peer": best_peer / times["kiln"],
                    "max_rel_err_vs_fp64": err,
                    "kiln_tuned": common.tuned_configs(tune_dir, seen),
                }
                if len(blocks) > 1:
                    record["speedup_per_block"] = [
                        min(b["eager"], b["compiled"]) / b["kiln"] for b in blocks]
                if back_to_back:
                    record["back_to_back_us"] = back_to_back
                    record["back_to_back_speedup"] = min(
                        back_to_back["eager"], back_to_back["compiled"]) / back_to_back["kiln"]
                rows.append(record)
                print(f"{form} {tokens}x{width}: " + ", ".join(
                    f"{k} {v * 1e3:.1f} us" for k, v in times.items()), flush=True)
                del inputs, out, expected
        write_results(args, env, copy_gbs, rows, overhead, kiln)


if __name__ == "__main__":
    main()

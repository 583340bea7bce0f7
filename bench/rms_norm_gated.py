"""The gated RMSNorm that closes the linear attention of Qwen3-Next and Qwen3.5 (and, with a
sigmoid gate, of Kimi Linear): kiln.rms_norm_gated beside the model's own module (transformers'
Qwen3NextRMSNormGated, or its restatement where the import fails) and torch.compile of it, bf16,
with a copy of the same bytes in the same rounds. The rows are value heads: Qwen3-Next-80B's 32
heads of 128 for each token, x and the gate z each [tokens * 32, 128], as the attention reshapes
them. Bytes: x and z read once, the output written once, the weight once. The 1- and
128-token cases are also timed back to back on the host, as a model without CUDA graphs calls
them.

Usage: python bench/rms_norm_gated.py [--out DIR] [--quick] [--tag TAG]
Writes DIR/rms_norm_gated-<date>-<device>.json and .md; prints the table last."""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16
COPY = "copy of the same bytes"
HEADS, HEAD_DIM = 32, 128
TOKENS = (1, 128, 4096, 16384)


def gated_norm_module(activation):
    """The model's module (transformers' class, its weight randomised), and where it came from."""
    try:
        if activation == "silu":
            from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated as cls
        else:
            from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated as cls
        module, source = cls(HEAD_DIM, eps=1e-6), "transformers"
    except ImportError:
        module, source = Restated(HEAD_DIM, activation), "restated"
    with torch.no_grad():
        module.weight.copy_(1 + 0.2 * torch.randn(HEAD_DIM))
    return module.to("cuda", BF16), source


class Restated(torch.nn.Module):
    """Qwen3NextRMSNormGated.forward (silu) and KimiLinearRMSNormGated.forward (sigmoid), restated."""

    def __init__(self, hidden, activation):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon, self.activation = 1e-6, activation

    def forward(self, hidden_states, gate):
        dtype = hidden_states.dtype
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.activation == "silu":
            h = self.weight * h.to(dtype)
            return (h * torch.nn.functional.silu(gate.float())).to(dtype)
        h = self.weight.float() * h
        return (h * torch.sigmoid(gate.float())).to(dtype)


def rel_err(actual, expected):
    a, e = actual.double(), expected.double()
    return ((a - e).abs() / e.abs().clamp_min(1.0)).max().item()


def cases(quick):
    import kiln

    shapes = [(t, "silu") for t in TOKENS] + [(4096, "sigmoid")]
    if quick:
        shapes = [(1, "silu"), (4096, "silu")]
    for tokens, activation in shapes:
        module, source = gated_norm_module(activation)
        rows = tokens * HEADS
        x = torch.randn(rows, HEAD_DIM, device="cuda", dtype=BF16)
        z = torch.randn(rows, HEAD_DIM, device="cuda", dtype=BF16)
        compiled = torch.compile(module.forward, dynamic=False)
        model = "Qwen3-Next" if activation == "silu" else "Kimi Linear (sigmoid)"

        def fused(x=x, z=z, w=module.weight, activation=activation):
            return kiln.rms_norm_gated(x, z, w, 1e-6, activation)

        yield {
            "name": f"{model} {tokens} tokens: [{rows}, {HEAD_DIM}]",
            "bytes": 3 * x.numel() * 2 + HEAD_DIM * 2,
            "launch_bound": tokens <= 128,
            "kiln": fused,
            "peers": {f"eager ({source})": lambda m=module, x=x, z=z: m(x, z),
                      "compiled": lambda c=compiled, x=x, z=z: c(x, z)},
            "check": lambda fused=fused, m=module, x=x, z=z: rel_err(fused(), m(x, z)),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a subset of the shapes")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    kiln = common.fresh_kiln(256)
    env = common.environment()
    copy_gbs = common.copy_bandwidth_gbs()
    tunes, seen = common.tune_dir(kiln), set()
    rows = []
    with torch.no_grad():
        for case in cases(args.quick):
            contenders = {"kiln": case["kiln"], **case["peers"]}
            times = common.bench_side_by_side({**contenders, COPY: common.same_bytes_copy(case["bytes"])})
            copy_ms = times.pop(COPY)
            best_peer = min(v for k, v in times.items() if k != "kiln")
            row = {
                "case": case["name"],
                "bytes": case["bytes"],
                "us": {k: v * 1e3 for k, v in times.items()},
                "copy_same_bytes_us": copy_ms * 1e3,
                "pct_of_copy": {k: 100 * case["bytes"] / (v * 1e-3) / 1e9 / copy_gbs for k, v in times.items()},
                "speedup_vs_best_peer": best_peer / times["kiln"],
                "rel_err_vs_module": case["check"](),
                "kiln_tuned": common.tuned_configs(tunes, seen),
            }
            if case["launch_bound"]:
                row["host_us"] = common.host_side_by_side(contenders)
            rows.append(row)
            print(row["case"], f"{row['us']['kiln']:.1f} us", f"{row['speedup_vs_best_peer']:.2f}x", flush=True)
    geomean = math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in rows) / len(rows))
    result = {"environment": env, "copy_gbs": copy_gbs, "rms_norm_gated_bf16": rows,
              "geomean_speedup_vs_best_peer": geomean, "kiln_settings": kiln.settings()}
    stamp = common.stamp(env) + (f"-{args.tag}" if args.tag else "")
    common.write_json(os.path.join(args.out, f"rms_norm_gated-{stamp}.json"), result)
    lines = [
        f"Gated RMSNorm (linear attention's value heads), bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}, triton {env['versions'].get('triton', '-')}, "
        f"transformers {env['versions'].get('transformers', '-')}; copy {copy_gbs:.0f} GB/s; "
        f"{common.timing_description()}",
        "",
        "| case | MB | kiln us (% copy) | eager us | compiled us (% copy) | kiln vs best peer "
        "| copy of same MB us | rel err vs module |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        eager = next(k for k in us if k.startswith("eager"))
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us[eager]:.1f} | {us['compiled']:.1f} ({pct['compiled']:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['copy_same_bytes_us']:.1f} "
                     f"| {r['rel_err_vs_module']:.1e} |")
    host = [r for r in rows if "host_us" in r]
    if host:
        lines += ["", "Called back to back (host wall time per call, us):", "",
                  "| case | kiln | eager | compiled |", "| --- | --- | --- | --- |"]
        for r in host:
            h = r["host_us"]
            eager = next(k for k in h if k.startswith("eager"))
            lines.append(f"| {r['case']} | {h['kiln']:.1f} | {h[eager]:.1f} | {h['compiled']:.1f} |")
    lines += ["", f"Geometric mean of kiln vs the best peer: {geomean:.2f}x"]
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"rms_norm_gated-{stamp}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

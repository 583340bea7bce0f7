"""What a specialisation's first call costs: cold (an empty cache: compile and fast tune) and
warm (the tuned binary read from the disk cache once the process has forgotten the loaded
kernel), for the norm family over hidden sizes x row counts, against the targets of 1.5 s
cold and 20 ms warm.

Every case gets a cache of its own, so no case reuses a binary another compiled. The tune's
own record (``kiln.report``) gives its wall time, the configs it measured and the slowest
single NVRTC compile. Writes first-call-<date>-<device><tag>.{json,md} under --out."""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TIMING = ("host wall time of one call, the device synchronized before and after; cold on an "
          "empty cache of the case's own, warm after forgetting the loaded kernel")
COLD_TARGET_MS = 1500
WARM_TARGET_MS = 20
OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "adaln", "gated_adaln")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def norm_call(kiln, op, hidden, rows, dtype):
    """A call of `op` on inputs of `rows` x `hidden`, modulation broadcast per sample."""
    x = torch.randn(1, rows, hidden, device="cuda", dtype=dtype)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    if op == "rms_norm":
        return lambda: kiln.rms_norm(x, w, 1e-6)
    if op == "fused_add_rms_norm":
        residual = torch.randn_like(x)
        return lambda: kiln.fused_add_rms_norm(x, residual, w, 1e-6)
    if op == "layer_norm":
        b = torch.randn_like(w)
        return lambda: kiln.layer_norm(x, w, b, 1e-6)
    scale = torch.randn(1, 1, hidden, device="cuda", dtype=dtype)
    shift = torch.randn_like(scale)
    if op == "adaln":
        return lambda: kiln.adaln(x, scale, shift, w)
    if op == "gated_adaln":
        y, gate = torch.randn_like(x), torch.randn_like(scale)
        return lambda: kiln.gated_adaln(x, y, gate, scale, shift, w)
    raise ValueError(f"unknown op {op}")


def tune_record(kiln, cache_dir):
    report = json.loads(kiln.report("json", cache_dir=cache_dir))
    results = [r for device in report["devices"] for r in device["results"]]
    if len(results) != 1:
        raise RuntimeError(f"expected one tuning result in {cache_dir}, found {len(results)}")
    result = results[0]
    compiles = [c["compile_ms"] for c in result["candidates"] if c["compile_ms"]]
    return {"tune_ms": result["tune_ms"], "configs": len(result["candidates"]),
            "slowest_compile_ms": max(compiles, default=0.0), "winner": result["winner"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--hidden", default="2432,4096,4544,14848")
    parser.add_argument("--rows", default="1,128,2688,32768")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--tag", default="", help="appended to the result file names")
    args = parser.parse_args()

    import kiln

    env = common.environment()
    env["timing"] = TIMING
    env["dtype"] = args.dtype
    torch.ones(1, device="cuda").sum().item()  # the CUDA context is not kiln's cost
    cases = []
    for op in args.ops.split(","):
        for hidden in (int(h) for h in args.hidden.split(",")):
            for rows in (int(r) for r in args.rows.split(",")):
                cache_dir = tempfile.mkdtemp(prefix="kiln-first-call-")
                kiln.configure(cache_dir=cache_dir, tune="fast")
                call = norm_call(kiln, op, hidden, rows, DTYPES[args.dtype])
                cold = common.first_call_ms(call)
                kiln._C.forget_kernels()  # the next call resolves from the disk cache
                warm = common.first_call_ms(call)
                case = {"op": op, "hidden": hidden, "rows": rows, "cold_ms": cold, "warm_ms": warm,
                        **tune_record(kiln, cache_dir)}
                shutil.rmtree(cache_dir, ignore_errors=True)
                cases.append(case)
                print(f"{op} {rows}x{hidden}: cold {cold:.0f} ms (tune {case['tune_ms']:.0f} ms, "
                      f"{case['configs']} configs, slowest compile "
                      f"{case['slowest_compile_ms']:.0f} ms), warm {warm:.1f} ms", flush=True)

    colds = [c["cold_ms"] for c in cases]
    warms = [c["warm_ms"] for c in cases]
    summary = {
        "cases": len(cases),
        "cold_median_ms": statistics.median(colds), "cold_max_ms": max(colds),
        "cold_over_target": sum(c > COLD_TARGET_MS for c in colds),
        "warm_median_ms": statistics.median(warms), "warm_max_ms": max(warms),
        "warm_over_target": sum(w > WARM_TARGET_MS for w in warms),
    }
    name = f"first-call-{common.stamp(env)}{args.tag}"
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"environment": env, "targets_ms": {"cold": COLD_TARGET_MS,
                                                          "warm": WARM_TARGET_MS},
                       "summary": summary, "cases": cases})
    lines = [f"# First calls, {args.dtype}, {env['device']} ({env['sm']}), {env['date']}", "",
             "| op | rows | hidden | cold ms | tune ms | configs | slowest compile ms | warm ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in cases:
        lines.append(f"| {c['op']} | {c['rows']} | {c['hidden']} | {c['cold_ms']:.0f} | "
                     f"{c['tune_ms']:.0f} | {c['configs']} | {c['slowest_compile_ms']:.0f} | "
                     f"{c['warm_ms']:.1f} |")
    lines += ["", f"Cold: median {summary['cold_median_ms']:.0f} ms, longest "
              f"{summary['cold_max_ms']:.0f} ms, {summary['cold_over_target']} of {len(cases)} "
              f"over {COLD_TARGET_MS} ms. Warm: median {summary['warm_median_ms']:.1f} ms, longest "
              f"{summary['warm_max_ms']:.1f} ms, {summary['warm_over_target']} over "
              f"{WARM_TARGET_MS} ms."]
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()

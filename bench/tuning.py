"""The autotuner's own benchmark: a `full` and a `fast` tune of the same problems (by default
RMSNorm with a weight and SwiGLU, hidden 4096, bf16, over the benchmark grid's row counts; `--ops`
takes any forward op, shaped as `make_call` says), each on a fresh cache, then the three
configs that result per problem (heuristic, fast winner, full winner) timed side by side
through the ops, in one process. The heuristic is what a cache filled offline (`kiln prewarm`
without a GPU) serves under `KILN_TUNE=off`.

What it records, per op and row count:
- the tune itself: candidates measured, tune time (the tuner's clock) and the cold first call
  (compile and tune included, wall clock), for both modes;
- fast vs full: the fast winner's median as measured inside the full tune (the same
  measurement session as the full winner's) and as an op call beside the full winner's;
- tuned vs heuristic: the same two ways.
The full tune's report goes beside it as JSON and HTML (`kiln report`), with the copy
bandwidth kiln measured on the device.

Usage: python bench/tuning.py [--out DIR] [--quick] [--ops rms_norm,swiglu] [--hidden 4096]
                             [--rows 128,8192] [--tag -name] [--also OP=CONFIG ...]
`--also` times one more config of OP (one the full tune measured, e.g. an earlier heuristic's)
as an op call beside the others, at every row count.
Writes DIR/tuning-<date>-<device>.{json,md} and DIR/tune-report-<date>-<device>.{json,html}."""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

ROWS = [1, 128, 2688, 8192, 32768]
QUICK_ROWS = [128, 8192]
FAST_WITHIN = 0.03  # the bar: fast's winner within 3% of full's


HEAD_DIM = 128  # the RoPE ops' head dim (Llama, Wan, FLUX)


def make_call(kiln, op, rows, hidden):
    """One call of `op` on `rows` tokens of width `hidden`, bf16, shaped as the models call it:
    the norms and activations [rows, hidden] ([1, rows, hidden] for the DiT ops, their
    modulation per sample); rope Llama's half-split [1, hidden/128, rows, 128] q and k with a
    bf16 table; rms_norm_rope Wan's ([1, rows, hidden] q and k, each head's pairs from fp32
    half tables)."""
    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, device="cuda", dtype=dtype)

    if op == "rms_norm":
        x, w = r(rows, hidden), r(hidden)
        return lambda: kiln.rms_norm(x, w, 1e-6)
    if op == "fused_add_rms_norm":
        x, residual, w = r(rows, hidden), r(rows, hidden), r(hidden)
        return lambda: kiln.fused_add_rms_norm(x, residual, w, 1e-6)
    if op == "layer_norm":
        x = r(rows, hidden)
        return lambda: kiln.layer_norm(x, None, None, 1e-6)
    if op == "adaln":
        x, scale, shift = r(1, rows, hidden), r(1, 1, hidden), r(1, 1, hidden)
        return lambda: kiln.adaln(x, scale, shift)
    if op == "gated_adaln":
        h, y = r(1, rows, hidden), r(1, rows, hidden)
        gate, scale, shift = r(1, 1, hidden), r(1, 1, hidden), r(1, 1, hidden)
        return lambda: kiln.gated_adaln(h, y, gate, scale, shift)
    if op == "rope":
        heads = hidden // HEAD_DIM
        q, k = r(1, heads, rows, HEAD_DIM), r(1, heads, rows, HEAD_DIM)
        cos, sin = r(rows, HEAD_DIM), r(rows, HEAD_DIM)
        return lambda: kiln.rope(q, k, cos, sin)
    if op == "rms_norm_rope":
        q, k, qw, kw = r(1, rows, hidden), r(1, rows, hidden), r(hidden), r(hidden)
        cos = r(rows, HEAD_DIM // 2, dtype=torch.float32)
        sin = r(rows, HEAD_DIM // 2, dtype=torch.float32)
        return lambda: kiln.rms_norm_rope(q, k, qw, kw, 1e-6, cos, sin, head_dim=HEAD_DIM)
    if op in ("swiglu", "geglu"):
        gate, up = r(rows, hidden), r(rows, hidden)
        return lambda: getattr(kiln, op)(gate, up)
    if op == "gelu":
        x = r(rows, hidden)
        return lambda: kiln.gelu(x)
    if op == "gated_residual":
        h, y, gate = r(1, rows, hidden), r(1, rows, hidden), r(1, 1, hidden)
        return lambda: kiln.gated_residual(h, y, gate)
    raise SystemExit(f"bench/tuning.py: --ops: expected some of {', '.join(OPS)}, got {op!r}")


OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "adaln", "gated_adaln", "rope",
       "rms_norm_rope", "swiglu", "geglu", "gelu", "gated_residual"]


def tune_all(kiln, mode, ops, rows_list, hidden):
    """A fresh cache tuned in `mode` by first op calls; returns (cache dir, cold seconds)."""
    cache = tempfile.mkdtemp(prefix=f"kiln-tune-{mode}-")
    kiln.configure(cache_dir=cache, tune=mode)
    cold = {}
    for op in ops:
        for rows in rows_list:
            call = make_call(kiln, op, rows, hidden)
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            cold[(op, rows)] = time.perf_counter() - start
    return cache, cold


def results_by_key(report, rows_list):
    """(op, rows) -> the report's result for that call (one device). An op's buckets count
    the rows its family counts (RoPE's are head rows), so each op's results are matched to
    the row counts in order."""
    by_op = {}
    for device in report["devices"]:
        for result in device["results"]:
            by_op.setdefault(result["op"], []).append(result)
    out = {}
    for op, results in by_op.items():
        results.sort(key=lambda result: result["bucket_rows"])
        if len(results) != len(rows_list):
            raise SystemExit(f"bench/tuning.py: {op}: {len(results)} tune results for "
                             f"{len(rows_list)} row counts")
        for rows, result in zip(sorted(rows_list), results):
            out[(op, rows)] = result
    return out


def row_blind_heuristic(kiln, problem):
    """The family's heuristic for calls of any row count (what a prewarm record serves past its
    row ranges, and every bucket before those ranges existed), as `kiln compile` gives it for
    this GPU. Its PTX goes to a scratch cache, not to one of the caches being timed."""
    settings = kiln.settings()
    scratch = tempfile.mkdtemp(prefix="kiln-tune-scratch-")
    kiln.configure(cache_dir=scratch)
    try:
        return kiln.compile(problem["op"], problem["dtype"], problem["hidden"], arch="native",
                            flags=problem["flags"], align=problem["align"],
                            aux=problem.get("aux", 0), format="ptx")["config"]
    finally:
        kiln.configure(cache_dir=settings["cache_dir"])
        shutil.rmtree(scratch, ignore_errors=True)


def pinned_copy(kiln, full_cache, result, config_key):
    """A copy of the full tune's cache whose result for `result`'s bucket is pinned to
    `config_key` (one of the full tune's measured candidates)."""
    copy = tempfile.mkdtemp(prefix="kiln-tune-pinned-")
    shutil.copytree(full_cache, copy, dirs_exist_ok=True)
    kiln.tune_pin(problem=result["problem_key"], bucket=result["bucket_rows"],
                  config=config_key, cache_dir=copy)
    return copy


def candidate_us(result, config_key):
    for candidate in result["candidates"]:
        if candidate["config"] == config_key and candidate["status"] == "ok":
            return candidate["median_us"]
    return None


ROUNDS = 10
BLOCK_WARMUP, BLOCK_REPS = 5, 10


def time_configs(kiln, caches, op, rows, hidden):
    """Median us of the op with each cache's stored config, over ROUNDS rounds in which each
    config runs one block of calls (its config re-resolved, then BLOCK_WARMUP untimed and
    BLOCK_REPS timed calls back to back, each after an L2 flush), in an order that reverses
    every round. Few timed calls per block and many blocks: one long block per config biased
    it by how many flushes came before it (the time of a microsecond kernel after a flush
    alternates from call to call), and a sync after every call let the GPU idle and slow its
    clocks. The flush is the benches' (common.l2_flush): a memset alone leaves the lines a
    re-read config read with evict_last in L2, to the next call's profit."""
    calls = {label: make_call(kiln, op, rows, hidden) for label in caches}
    flush = common.l2_flush()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(BLOCK_REPS)]
    samples = {label: [] for label in caches}
    labels = list(caches)
    for round_index in range(ROUNDS):
        for label in labels if round_index % 2 == 0 else reversed(labels):
            kiln.configure(cache_dir=caches[label], tune="off")
            call = calls[label]
            call()  # resolves this cache's config (a disk read and a module load)
            for _ in range(BLOCK_WARMUP):
                flush()
                call()
            for start, end in events:
                flush()
                start.record()
                call()
                end.record()
            torch.cuda.synchronize()
            samples[label] += [start.elapsed_time(end) * 1e3 for start, end in events]
    return {label: statistics.median(values) for label, values in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/latest")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ops", default="rms_norm,swiglu",
                        help=f"comma-separated, of: {','.join(OPS)}")
    parser.add_argument("--rows", default=None,
                        help="comma-separated row counts (default: the benchmark grid's)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tag", default="", help="appended to the output files' names")
    parser.add_argument("--also", action="append", default=[], metavar="OP=CONFIG",
                        help="one more config of OP to time as an op call (repeatable)")
    args = parser.parse_args()
    args_also = {}
    for item in args.also:
        op, sep, config = item.partition("=")
        if not sep or not config:
            parser.error(f"--also: expected OP=CONFIG, got {item!r}")
        args_also[op] = config
    ops = [op for op in args.ops.split(",") if op]
    rows_list = QUICK_ROWS if args.quick else ROWS
    if args.rows:
        rows_list = [int(v) for v in args.rows.split(",")]

    kiln = common.fresh_kiln()
    env = common.environment()
    env["kiln"] = kiln.__version__
    copy_gbs = common.copy_bandwidth_gbs()

    full_cache, full_cold = tune_all(kiln, "full", ops, rows_list, args.hidden)
    fast_cache, fast_cold = tune_all(kiln, "fast", ops, rows_list, args.hidden)
    heuristic_cache = tempfile.mkdtemp(prefix="kiln-tune-heuristic-")
    full = json.loads(kiln.report("json", cache_dir=full_cache))
    fast = json.loads(kiln.report("json", cache_dir=fast_cache))
    full_results = results_by_key(full, rows_list)
    fast_results = results_by_key(fast, rows_list)

    rows_out = []
    for op in ops:
        for rows in rows_list:
            f, q = full_results[(op, rows)], fast_results[(op, rows)]
            bucket = f["bucket_rows"]
            fast_in_full = candidate_us(f, q["winner"])
            caches = {"heuristic": heuristic_cache, "fast": fast_cache, "full": full_cache}
            row_blind = row_blind_heuristic(kiln, f["problem"])
            # Pinned only where the full tune measured it (a candidate that failed is refused).
            if row_blind != f["heuristic"] and candidate_us(f, row_blind) is not None:
                caches["row_blind"] = pinned_copy(kiln, full_cache, f, row_blind)
            also = args_also.get(op)
            if also is not None and candidate_us(f, also) is not None:
                caches["also"] = pinned_copy(kiln, full_cache, f, also)
            timed = time_configs(kiln, caches, op, rows, args.hidden)
            for label in ("row_blind", "also"):
                if label in caches:
                    shutil.rmtree(caches[label], ignore_errors=True)
            rows_out.append({
                "op": op, "rows": rows, "bucket": bucket,
                "full": {"winner": f["winner"], "candidates": len(f["candidates"]),
                         "tune_ms": f["tune_ms"], "cold_s": full_cold[(op, rows)],
                         "winner_us": f["winner_median_us"],
                         "heuristic_us": f["heuristic_median_us"],
                         "speedup_over_heuristic": f["speedup_over_heuristic"]},
                "fast": {"winner": q["winner"], "candidates": len(q["candidates"]),
                         "tune_ms": q["tune_ms"], "cold_s": fast_cold[(op, rows)],
                         "winner_us_in_full_tune": fast_in_full,
                         "speedup_over_heuristic": q["speedup_over_heuristic"]},
                "fast_over_full_in_tune": (fast_in_full / f["winner_median_us"]
                                           if fast_in_full else None),
                "heuristic": f["heuristic"],
                "row_blind_heuristic": {"config": row_blind,
                                        "us_in_full_tune": candidate_us(f, row_blind)},
                "also": {"config": also, "us_in_full_tune": candidate_us(f, also)} if also else None,
                "op_call_us": timed,
                "fast_over_full_op_call": timed["fast"] / timed["full"],
                "tuned_speedup_op_call": timed["heuristic"] / timed["full"],
            })

    document = {"benchmark": "tuning", "environment": env, "hidden": args.hidden,
                "dtype": "bf16", "copy_bandwidth_gbs_torch": copy_gbs,
                "copy_bandwidth_gbs_kiln": next(iter(full["devices"]), {}).get(
                    "copy_bandwidth_gbs"),
                "fast_within": FAST_WITHIN, "op_call_flush": common.flush_description(),
                "rows": rows_out}
    tag = common.stamp(env) + ("-quick" if args.quick else "") + args.tag
    common.write_json(os.path.join(args.out, f"tuning-{tag}.json"), document)
    with open(os.path.join(args.out, f"tune-report-{tag}.json"), "w") as f:
        f.write(kiln.report("json", cache_dir=full_cache))
    with open(os.path.join(args.out, f"tune-report-{tag}.html"), "w") as f:
        f.write(kiln.report("html", cache_dir=full_cache))
    table = markdown(document)
    with open(os.path.join(args.out, f"tuning-{tag}.md"), "w") as f:
        f.write(table)
    print(table)


def seconds(ms):
    return None if ms is None else ms / 1e3


def fmt(value, digits=2, suffix=""):
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def row_blind_cell(row):
    """The row-blind heuristic's op-call time over the row-aware one's, where they differ."""
    blind = row.get("row_blind_heuristic", {})
    us = row["op_call_us"].get("row_blind")
    if us is None:
        return "same" if blind else "n/a"
    return f"`{blind['config']}`, {fmt(us)}, {us / row['op_call_us']['heuristic']:.2f}x"


def also_cell(row):
    """The --also config's op-call time over the heuristic's."""
    also = row.get("also")
    us = row["op_call_us"].get("also")
    if not also:
        return "n/a"
    if us is None:
        return f"`{also['config']}`, not in the full tune"
    return f"`{also['config']}`, {fmt(us)}, {us / row['op_call_us']['heuristic']:.2f}x"


def markdown(document):
    env = document["environment"]
    lines = [
        f"# Tuning: full vs fast vs heuristic, {env['device']} ({env['sm']}), {env['date']}",
        "",
        f"bf16, hidden {document['hidden']}; kiln {env['kiln']}, torch {env['versions']['torch']}."
        f" Copy bandwidth measured by kiln: {fmt(document['copy_bandwidth_gbs_kiln'], 0)} GB/s"
        f" (torch copy_: {fmt(document['copy_bandwidth_gbs_torch'], 0)} GB/s).",
        "",
        "fast/full: the fast winner's median over the full winner's, inside the full tune and as"
        " op calls side by side (1.00 = same speed); tuned: heuristic over full winner. The"
        " heuristic is the family's for the rows' bucket; where the family's heuristic for any"
        " row count differs, its op-call time beside it; then a config named by --also, over"
        " the heuristic. Op calls are timed after "
        f"{document.get('op_call_flush', 'a 256 MB memset before every call')}.",
        "",
        "| op | rows | full: configs, tune s, cold s | fast: configs, tune s, cold s "
        "| full winner | fast winner | fast/full (tune) | fast/full (op) | tuned x (tune) "
        "| tuned x (op) | op us: heur / fast / full | row-blind heuristic: config, us, over heur "
        "| --also: config, us, over heur |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in document["rows"]:
        f, q, t = r["full"], r["fast"], r["op_call_us"]
        lines.append(
            f"| {r['op']} | {r['rows']} | {f['candidates']}, {fmt(seconds(f['tune_ms']))}, "
            f"{fmt(f['cold_s'])} | {q['candidates']}, {fmt(seconds(q['tune_ms']))}, "
            f"{fmt(q['cold_s'])} | `{f['winner']}` | `{q['winner']}` | "
            f"{fmt(r['fast_over_full_in_tune'], 3)} | {fmt(r['fast_over_full_op_call'], 3)} | "
            f"{fmt(f['speedup_over_heuristic'])}x | {fmt(r['tuned_speedup_op_call'])}x | "
            f"{fmt(t['heuristic'])} / {fmt(t['fast'])} / {fmt(t['full'])} | "
            f"{row_blind_cell(r)} | {also_cell(r)} |")
    worst = max((r["fast_over_full_in_tune"] or 0) for r in document["rows"])
    ok = worst <= 1 + document["fast_within"]
    lines += ["", f"Worst fast/full inside the full tune: {worst:.3f} "
              f"({'within' if ok else 'NOT within'} {document['fast_within']:.0%})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""Persistent grids where the grid covers the call. A norm config with `grid=N` launches
min(N, covering grid) CTAs and walks its rows with the grid-stride loop (and a next-row
prefetch); where N covers every row of the call's bucket, its twin without `grid` launches the
same CTAs in one pass. This compares each such pair, on full tunes of small calls:
1. inside each full tune, the pair's medians (the tuner's own timing);
2. as op calls side by side (bench/tuning.py's time_configs, the benches' flush): the full
   winner against its twin where the winner is such a grid, and the tune's fastest covering
   grid against its twin.

Usage: python bench/diagnostics/covering_grid.py [--ops rms_norm,adaln] [--hidden 2048,4096]
                                                 [--rows 1,128]
bf16, shaped as bench/tuning.py's make_call. Prints one markdown table a section."""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import tuning  # noqa: E402

GRID = re.compile(r"\.grid=(\d+)")
SPLIT = re.compile(r"^v(\d+)\.t(\d+)\.c(\d+)")


def covering_twin(config, bucket):
    """The one-pass twin of `config` where its persistent grid covers `bucket` rows, else None."""
    grid, split = GRID.search(config), SPLIT.match(config)
    if grid is None or split is None or "cluster" in config:
        return None
    rows_per_cta = max(int(split.group(3)) // int(split.group(2)), 1)
    if int(grid.group(1)) < math.ceil(bucket / rows_per_cta):
        return None
    return GRID.sub("", config)


def pairs_of(result):
    """(grid config, twin, grid us, twin us) for every covering grid whose twin was measured."""
    ok = {c["config"]: c["median_us"] for c in result["candidates"] if c["status"] == "ok"}
    pairs = []
    for config, us in ok.items():
        twin = covering_twin(config, result["bucket_rows"])
        if twin is not None and twin in ok:
            pairs.append((config, twin, us, ok[twin]))
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="rms_norm,fused_add_rms_norm,layer_norm,adaln")
    parser.add_argument("--hidden", default="2048,4096,8192")
    parser.add_argument("--rows", default="1,128")
    args = parser.parse_args()
    ops = args.ops.split(",")
    rows_list = [int(v) for v in args.rows.split(",")]
    kiln = common.fresh_kiln()
    env = common.environment()
    print(f"{env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; "
          f"op calls timed after {common.flush_description()}")

    in_tune, op_calls = [], []
    for hidden in [int(v) for v in args.hidden.split(",")]:
        cache, _ = tuning.tune_all(kiln, "full", ops, rows_list, hidden)
        report = json.loads(kiln.report("json", cache_dir=cache))
        results = tuning.results_by_key(report, rows_list)
        for op in ops:
            for rows in rows_list:
                result = results[(op, rows)]
                pairs = pairs_of(result)
                if not pairs:
                    continue
                ratios = [grid_us / twin_us for _, _, grid_us, twin_us in pairs]
                in_tune.append((op, rows, hidden, len(pairs), statistics.geometric_mean(ratios),
                                min(ratios), max(ratios)))
                winner = result["winner"]
                chosen = {"fastest covering grid": min(pairs, key=lambda p: p[2])}
                twin = covering_twin(winner, result["bucket_rows"])
                if twin is not None and any(p[0] == winner for p in pairs):
                    chosen["full winner"] = next(p for p in pairs if p[0] == winner)
                for why, (grid, twin, grid_us, twin_us) in chosen.items():
                    caches = {"grid": tuning.pinned_copy(kiln, cache, result, grid),
                              "twin": tuning.pinned_copy(kiln, cache, result, twin)}
                    timed = tuning.time_configs(kiln, caches, op, rows, hidden)
                    for path in caches.values():
                        shutil.rmtree(path, ignore_errors=True)
                    op_calls.append((op, rows, hidden, why, grid, twin, grid_us / twin_us,
                                     timed["grid"], timed["twin"]))
                    print(f"{op} {rows}x{hidden} {why}: {grid} {timed['grid']:.2f} us, "
                          f"{twin} {timed['twin']:.2f} us", flush=True)
        shutil.rmtree(cache, ignore_errors=True)

    print("\n## In the full tunes: covering grid / its one-pass twin (tuner medians)\n")
    print("| op | rows x hidden | pairs | geomean | min | max |\n| --- | --- | --- | --- | --- | --- |")
    for op, rows, hidden, n, mean, low, high in in_tune:
        print(f"| {op} | {rows}x{hidden} | {n} | {mean:.3f} | {low:.3f} | {high:.3f} |")
    every = [r[4] for r in in_tune]
    if every:
        print(f"\nProblems: {len(every)}; geometric mean of their means {statistics.geometric_mean(every):.3f}")
    print("\n## As op calls, side by side\n")
    print("| op | rows x hidden | pair | grid config | in tune grid/twin | op us grid / twin | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for op, rows, hidden, why, grid, twin, tune_ratio, grid_us, twin_us in op_calls:
        print(f"| {op} | {rows}x{hidden} | {why} | `{grid}` | {tune_ratio:.3f} | "
              f"{grid_us:.2f} / {twin_us:.2f} | {grid_us / twin_us:.3f} |")
    if op_calls:
        ratios = [r[7] / r[8] for r in op_calls]
        print(f"\nOp calls: {len(ratios)}; grid over twin geometric mean "
              f"{statistics.geometric_mean(ratios):.3f}, {sum(x > 1.0 for x in ratios)} slower, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()

"""What the memory system gives a kernel of each size, timed as every kernel bench here times:
a device-to-device copy (`copy_`, the "copy" the % columns divide by), PyTorch's own
elementwise kernel moving the same bytes (`torch.neg(x, out=y)`: one read, one write, a
covering grid of SM threads), the same kind of kernel reading two or three bytes for each it
writes (`torch.add`, `torch.addcmul`: the mixes of the gated activations and of adaln), and a
one-element `add_` (the floor of any launch), side by side in interleaved rounds, each call
after a 256 MB L2 flush. Sizes are the bytes moved
(read + written) at the thresholds of the issues' bandwidth targets (20, 128 MB) and at the
sizes the norm, RoPE and activation benches move.

Usage: python bench/copy_floor.py [--out DIR] [--quick]
Writes DIR/copy_floor-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

SIZES_MB = [20, 22, 44, 64, 88, 118, 128, 134, 176, 264, 344, 528, 1074, 2147]
QUICK_SIZES_MB = [22, 128, 344]
TARGETS = (0.80, 0.90, 0.95)


def contenders(moved):
    """{name: fn} moving `moved` bytes, plus the launch floor. The copy and the elementwise
    kernel read half and write half; `reads2` (`torch.add`) reads two bytes for each it writes,
    as the gated activations and gated_residual do, and `reads3` (`torch.addcmul`) three, as
    adaln (x, per-token scale and shift) and RoPE with a video-sized fp32 table do."""
    half = moved // 2
    src = torch.randn(half // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    thirds = [torch.randn(moved // 3 // 2, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    quarters = [torch.randn(moved // 4 // 2, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    tiny = torch.zeros(1, device="cuda")
    return {
        "copy": common.same_bytes_copy(moved),
        "elementwise": lambda: torch.neg(src, out=dst),
        "reads2": lambda: torch.add(thirds[0], thirds[1], out=thirds[2]),
        "reads3": lambda: torch.addcmul(quarters[0], quarters[1], quarters[2], out=quarters[3]),
        "launch": lambda: tiny.add_(1),
    }


def measure(sizes_mb, copy_gbs, sustained_copy_gbs):
    rows = []
    for mb in sizes_mb:
        moved = int(mb * 1e6) // 4 * 4
        times = common.bench_side_by_side(contenders(moved))
        row = {"moved_mb": moved / 1e6}
        for name, ms in times.items():
            row[f"{name}_us"] = ms * 1e3
            if name != "launch":
                row[f"{name}_pct_of_copy"] = 100 * moved / (ms * 1e-3) / 1e9 / copy_gbs
        sets = []
        for _ in range(common.input_sets_for(moved)):
            fns = contenders(moved)
            del fns["launch"]
            sets.append(fns)
        row["input_sets"] = len(sets)
        for name, ms in common.bench_sustained(sets).items():
            row[f"{name}_sustained_us"] = ms * 1e3
            row[f"{name}_sustained_pct_of_copy"] = 100 * moved / (ms * 1e-3) / 1e9 / sustained_copy_gbs
        del sets
        rows.append(row)
        print(f"{mb:6} MB  copy {row['copy_us']:8.2f} us ({row['copy_pct_of_copy']:5.1f}%)  "
              f"elementwise {row['elementwise_us']:8.2f} us ({row['elementwise_pct_of_copy']:5.1f}%)  "
              f"2:1 {row['reads2_us']:8.2f} us  3:1 {row['reads3_us']:8.2f} us  "
              f"launch {row['launch_us']:5.2f} us  sustained: copy {row['copy_sustained_pct_of_copy']:5.1f}%  "
              f"elementwise {row['elementwise_sustained_pct_of_copy']:5.1f}%", flush=True)
    return rows


def first_size_reaching(rows, fraction, timing=""):
    """The smallest size (MB) from which the better of the copy and the elementwise kernel
    stays at or above `fraction` of the 1 GiB copy (`timing` "_sustained": both timed
    sustained), or None."""
    best = [max(r[f"copy{timing}_pct_of_copy"], r[f"elementwise{timing}_pct_of_copy"]) >= 100 * fraction
            for r in rows]
    for i in range(len(rows)):
        if all(best[i:]):
            return rows[i]["moved_mb"]
    return None


def markdown(env, copy_gbs, sustained_copy_gbs, rows):
    lines = [f"# What a kernel of each size can reach, {env['device']} ({env['sm']}), {env['date']}", "",
             f"torch {env['versions']['torch']}, driver {env['driver']}; 1 GiB copy {copy_gbs:.0f} GB/s "
             f"({sustained_copy_gbs:.0f} GB/s sustained) in the same run. Single calls: {env['timing']}. Sustained: "
             f"{common.SUSTAINED_TIMING}.", "",
             "| MB moved | copy us (% of 1 GiB copy) | torch elementwise us (%) | two reads : one write us (%) "
             "| three reads : one write us (%) | one-element launch us "
             "| sustained copy us (%) | sustained elementwise us (%) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['moved_mb']:.0f} | {r['copy_us']:.2f} ({r['copy_pct_of_copy']:.0f}%) | "
                     f"{r['elementwise_us']:.2f} ({r['elementwise_pct_of_copy']:.0f}%) | "
                     f"{r['reads2_us']:.2f} ({r['reads2_pct_of_copy']:.0f}%) | "
                     f"{r['reads3_us']:.2f} ({r['reads3_pct_of_copy']:.0f}%) | {r['launch_us']:.2f} "
                     f"| {r['copy_sustained_us']:.2f} ({r['copy_sustained_pct_of_copy']:.0f}%) "
                     f"| {r['elementwise_sustained_us']:.2f} ({r['elementwise_sustained_pct_of_copy']:.0f}%) |")
    lines.append("")
    for fraction in TARGETS:
        found = []
        for timing, label in (("", "single calls"), ("_sustained", "sustained")):
            size = first_size_reaching(rows, fraction, timing)
            found.append(f"{label} from {size:.0f} MB" if size is not None else f"{label} at no size measured")
        lines.append(f"- {100 * fraction:.0f}% of the 1 GiB copy: reached, {found[0]}; {found[1]}.")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--quick", action="store_true", help="three sizes only")
    parser.add_argument("--tag", default="", help="appended to the result files' names")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("copy_floor: no CUDA device; nothing to measure")
        return
    env = common.environment()
    env["sustained_timing"] = common.SUSTAINED_TIMING
    copy_gbs = common.copy_bandwidth_gbs()
    sustained_copy_gbs = common.sustained_copy_bandwidth_gbs()
    rows = measure(QUICK_SIZES_MB if args.quick else SIZES_MB, copy_gbs, sustained_copy_gbs)
    stem = os.path.join(args.out, f"copy_floor-{common.stamp(env)}{args.tag}")
    common.write_json(stem + ".json", {"environment": env, "copy_gbs": copy_gbs,
                                       "sustained_copy_gbs": sustained_copy_gbs, "rows": rows})
    text = markdown(env, copy_gbs, sustained_copy_gbs, rows)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()

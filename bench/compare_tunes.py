"""Which full-tune winners differ between two devices, and by how much: for each op and row
bucket both reports hold, each device's winner, and what the other device's winner costs on
it (its median in this device's full tune over this device's winner's; 1.00 = as fast).

Usage: python bench/compare_tunes.py A.json B.json [-o OUT.md]
(A and B: `kiln report --format json` of a full tune on each device, e.g. bench/tuning.py's
tune-report-*.json.)"""

import argparse
import json


def results(path):
    report = json.load(open(path))
    device = report["devices"][0]
    by_key = {(r["op"], r["bucket_rows"]): r for r in device["results"]}
    return device["name"], by_key


def median_of(result, config):
    for candidate in result["candidates"]:
        if candidate["config"] == config and candidate["status"] == "ok":
            return candidate["median_us"]
    return None


def ratio(result, config):
    median = median_of(result, config)
    return None if median is None else median / result["winner_median_us"]


def fmt(value):
    return "n/a" if value is None else f"{value:.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("-o", "--out")
    args = parser.parse_args()
    name_a, a = results(args.a)
    name_b, b = results(args.b)
    lines = [f"# Full-tune winners: {name_a} (A) vs {name_b} (B)", "",
             "B's winner on A: its median in A's full tune over A's winner's; and the reverse.", "",
             "| op | bucket | winner on A | winner on B | same | B's winner on A | A's winner on B |",
             "|---|---|---|---|---|---|---|"]
    differ = 0
    for key in sorted(set(a) & set(b)):
        ra, rb = a[key], b[key]
        same = ra["winner"] == rb["winner"]
        differ += not same
        lines.append(f"| {key[0]} | {key[1]} | `{ra['winner']}` | `{rb['winner']}` | "
                     f"{'yes' if same else 'no'} | {fmt(ratio(ra, rb['winner']))} | "
                     f"{fmt(ratio(rb, ra['winner']))} |")
    lines += ["", f"{differ} of {len(set(a) & set(b))} winners differ."]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()

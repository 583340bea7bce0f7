"""Where each family stands against its issue's targets, from recorded bench results.

Reads result files of bench/norms.py (issue 3), bench/rope.py (issue 4) and
bench/activations.py (issue 5) and prints one markdown row per target: how many shapes it
covers, how many meet it, and the figures that decide it.

A bandwidth target is a fraction of the 1 GiB copy measured in the same run. Every record
also carries a same-size copy timed in the same rounds, so each bandwidth row says too how
many of its shapes that copy reaches the line at all: where it does not, no kernel that
moves those bytes gets there under this timing (BENCHMARKS.md, "What a kernel of each size
can reach"), and a miss there is the size's, not kiln's.

    python bench/targets.py \
        --norms bench/results/norms-...-current-b.json bench/results/norms-...-current-a.json:rows=32768 \
                bench/results/norms-...-layouts-final.json \
        --rope bench/results/rope-...-absent-extras.json \
        --activations bench/results/activations-...-scrub-large.json \
                      bench/results/activations-...-scrub-launch-bound.json

Files are read as bench/headroom.py reads them: `PATH[:FIELD=V1,V2]` keeps those records, and a
later file's records replace an earlier file's for the same shapes.
"""
import argparse
import statistics
import sys

import headroom

MB = 1e6

# Per family (its command-line option): (issue, bandwidth lines as (from MB, below MB or None,
# fraction of the 1 GiB copy), geometric mean asked over the best peer or None).
FAMILIES = {
    "norms": ("3", [(20, 128, 0.80), (128, None, 0.90)], 1.2),
    "rope": ("4", [(20, 128, 0.80), (128, None, 0.90)], 1.3),
    "activations": ("5", [(20, 128, 0.80), (128, None, 0.95)], None),
}


def kiln_fraction(record):
    """kiln's bandwidth as a fraction of the run's 1 GiB copy."""
    return record["pct_of_copy"]["kiln"] / 100.0


def copy_fraction(record):
    """The same-size copy's bandwidth on the same scale: same bytes, its own time."""
    return kiln_fraction(record) * record["us"]["kiln"] / record["copy_same_bytes_us"]


def speedup(record):
    return headroom.best_peer_us(record) / record["us"]["kiln"]


def shape_name(record):
    return " ".join(str(value) for _, value in headroom.shape_key(record))


def span(values, fmt):
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}" if values else "-"


def bandwidth_row(issue, records, low_mb, high_mb, line):
    """One bandwidth line over the records whose bytes fall in [low, high)."""
    covered = [r for r in records
               if r["bytes"] >= low_mb * MB and (high_mb is None or r["bytes"] < high_mb * MB)]
    met = [r for r in covered if kiln_fraction(r) >= line]
    reachable = [r for r in covered if copy_fraction(r) >= line]
    met_reachable = [r for r in reachable if kiln_fraction(r) >= line]
    where = f">= {low_mb} MB" if high_mb is None else f"{low_mb}-{high_mb} MB"
    figures = (f"kiln {span([100 * kiln_fraction(r) for r in covered], '{:.0f}')}%, "
               f"same-size copy {span([100 * copy_fraction(r) for r in covered], '{:.0f}')}%; "
               f"the copy reaches the line on {len(reachable)}, kiln on {len(met_reachable)} of them")
    return [issue, f">= {100 * line:.0f}% of copy, {where}", str(len(covered)), str(len(met)),
            figures]


def slower_row(issue, records, label, strictly_faster):
    """Never slower than the best peer (or, strictly_faster, faster than it) on every shape."""
    ratios = [speedup(r) for r in records]
    met = [x for x in ratios if (x > 1.0 if strictly_faster else x >= 1.0)]
    behind = sorted((r for r in records if speedup(r) < 1.0), key=speedup)
    figures = f"vs best peer {span(ratios, '{:.3f}')}x"
    if behind:
        figures += "; furthest behind: " + ", ".join(
            f"{shape_name(r)} {speedup(r):.3f}x" for r in behind[:3])
        if len(behind) > 3:
            figures += f" (+{len(behind) - 3} more)"
    return [issue, label, str(len(records)), str(len(met)), figures]


def geomean_row(issue, records, asked):
    measured = statistics.geometric_mean([speedup(r) for r in records])
    ceiling = statistics.geometric_mean(
        [headroom.best_peer_us(r) / r["copy_same_bytes_us"] for r in records])
    return [issue, f"geometric mean >= {asked:g}x over the best peer", str(len(records)),
            "1" if measured >= asked else "0",
            f"{measured:.3f}x; {ceiling:.3f}x if every call took a same-size copy's time"]


def back_to_back_row(issue, records):
    """Launch-bound shapes called back to back, as a model without CUDA graphs calls them."""
    timed = [r for r in records if "back_to_back_speedup" in r]
    ratios = [r["back_to_back_speedup"] for r in timed]
    return [issue, "1 and 128 tokens, called back to back: faster than both", str(len(timed)),
            str(sum(x > 1.0 for x in ratios)), f"vs best peer {span(ratios, '{:.2f}')}x"]


def rows_for(family, records):
    issue, lines, asked = FAMILIES[family]
    rows = [bandwidth_row(issue, records, low, high, line) for low, high, line in lines]
    if family == "activations":
        small = [r for r in records if r.get("tokens") in (1, 128)]
        large = [r for r in records if r.get("tokens") not in (1, 128)]
        if large:
            rows.append(slower_row(issue, large, "4096 and 16384 tokens: never slower", False))
        if small:
            rows.append(slower_row(issue, small, "1 and 128 tokens: faster than both (GPU time)",
                                   True))
            if any("back_to_back_speedup" in r for r in small):
                rows.append(back_to_back_row(issue, small))
    elif family == "rope":
        rows.append(slower_row(issue, records, "faster than every peer", True))
    else:
        rows.append(slower_row(issue, records, "never slower than the best peer", False))
    if asked is not None:
        rows.append(geomean_row(issue, records, asked))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for family in FAMILIES:
        parser.add_argument(f"--{family}", nargs="+", default=[], metavar="PATH[:FIELD=V]",
                            help=f"result files of bench/{family}.py, oldest first")
    args = parser.parse_args(argv)
    table = []
    for family in FAMILIES:
        sources = getattr(args, family)
        if not sources:
            continue
        records = headroom.load(sources, tool="targets")
        if not records:
            raise SystemExit(f"targets: --{family}: no records selected")
        table += rows_for(family, records)
    if not table:
        raise SystemExit("targets: give result files with --norms, --rope or --activations")
    headroom.print_table(["issue", "target", "shapes", "met", "figures"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

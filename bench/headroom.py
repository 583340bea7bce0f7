"""How far kernel work can still move a benchmark's geometric mean over the best peer.

Reads result files of bench/norms.py, bench/activations.py or bench/rope.py (every record
carries kiln's and the peers' times and a same-size copy's time, measured in the same rounds)
and prints, per group of records and over all of them:

- kiln's geometric mean over the best peer, as measured;
- kiln's time over the same-size copy's;
- the ceiling: the geometric mean kiln would reach if every call took a same-size copy's time.
  A kernel that reads and writes those bytes does not beat a copy of them, so no change to
  kiln's kernels moves the mean past this; a target above it needs the peers to be slower;
- the copy ratio a target asks for: the geometric mean of kiln's time over the copy's that
  would give `--target` over the best peer.

    python bench/headroom.py bench/results/norms-...-layouts-final.json \
        bench/results/norms-...-current-a.json:rows=32768 bench/results/norms-...-current-b.json \
        --by rows --by op --target 1.2

A file may be followed by `:field=value,value` to keep only those records (the records of a
later run of the same shapes replace an earlier file's: list the files oldest first).
"""
import argparse
import json
import statistics
import sys


def records_of(document, tool="headroom"):
    """The result records of a bench file: the list whose entries carry times."""
    for value in document.values():
        if isinstance(value, list) and value and isinstance(value[0], dict) and "us" in value[0]:
            return value
    raise SystemExit(f"{tool}: the file holds no list of result records with 'us' times")


def shape_key(record):
    """What identifies a measured shape, whichever bench wrote it."""
    names = ("op", "form", "case", "rows", "tokens", "hidden", "width")
    return tuple((name, record[name]) for name in names if name in record)


def parse_source(text, tool="headroom"):
    """'path' or 'path:field=v1,v2' -> (path, field or None, set of values as text)."""
    path, _, selector = text.partition(":")
    if not selector:
        return path, None, set()
    field, _, values = selector.partition("=")
    if not field or not values:
        raise SystemExit(f"{tool}: '{text}' should read PATH:FIELD=VALUE[,VALUE...]")
    return path, field, set(values.split(","))


def load(sources, tool="headroom"):
    """The records of `sources` (see the module's doc); `tool` names the caller in errors."""
    shapes = {}
    for source in sources:
        path, field, values = parse_source(source, tool)
        try:
            with open(path) as f:
                document = json.load(f)
        except (OSError, ValueError) as error:
            raise SystemExit(f"{tool}: cannot read {path}: {error}") from error
        for record in records_of(document, tool):
            if field is not None and str(record.get(field)) not in values:
                continue
            if "copy_same_bytes_us" not in record:
                raise SystemExit(f"{tool}: a record of {path} has no same-size copy time")
            shapes[shape_key(record)] = record
    return list(shapes.values())


def best_peer_us(record):
    return min(us for name, us in record["us"].items() if name != "kiln")


def summary(records, target):
    measured = statistics.geometric_mean([best_peer_us(r) / r["us"]["kiln"] for r in records])
    over_copy = statistics.geometric_mean([r["us"]["kiln"] / r["copy_same_bytes_us"] for r in records])
    ceiling = statistics.geometric_mean([best_peer_us(r) / r["copy_same_bytes_us"] for r in records])
    return [str(len(records)), f"{measured:.3f}x", f"{over_copy:.3f}", f"{ceiling:.3f}x",
            f"{ceiling / target:.3f}"]


def print_table(header, rows):
    """A markdown table of text cells."""
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="result JSON files, each PATH[:FIELD=V1,V2]")
    parser.add_argument("--by", action="append", default=[], help="a record field to group by")
    parser.add_argument("--target", type=float, default=1.2, help="geometric mean asked for")
    args = parser.parse_args(argv)
    records = load(args.sources)
    if not records:
        raise SystemExit("headroom: no records selected")
    header = ["group", "shapes", "kiln vs best peer", "kiln / same-size copy",
              "ceiling (kiln at the copy)", f"kiln / copy for {args.target:g}x"]
    rows = [["all"] + summary(records, args.target)]
    for field in args.by:
        for value in sorted({r.get(field) for r in records}, key=lambda v: (isinstance(v, str), v)):
            group = [r for r in records if r.get(field) == value]
            rows.append([f"{field} {value}"] + summary(group, args.target))
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

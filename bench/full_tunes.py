"""Full tunes of the norm grid, recorded for `kiln tune replay` and the replay doctest.

  python bench/full_tunes.py record --out DIR [--ops ...] [--hiddens ...] [--rows ...]
      On a GPU: a full tune (every config timed) of each op x hidden x rows case of
      bench/norms.py, on a fresh cache; after each case the tuning database is exported to
      DIR/full_tunes.json (a `kiln tune` bundle), so a run cut short keeps what it finished.
      Each tune times the case's own rows (its row bucket is the next power of two).
  python bench/full_tunes.py compact BUNDLE... -o FIXTURE.json
      No GPU: the full tunes of the bundles, each config as [vec_bytes, threads_per_row,
      cta_threads, extras?] with its median us, and the rows it was timed on (the format of
      tests/cpp/tuner/data/norm_full_tunes_h200.json). A problem and row count found in two
      bundles is taken from the first.
"""

import argparse
import json
import os
import sys
import time

NORM_OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "adaln", "gated_adaln"]
HIDDENS = [1536, 2048, 2432, 3072, 3584, 4096, 4544, 5120, 8192, 14848]
ROWS = [2688, 8192, 32768]


def record(args):
    os.environ["KILN_TUNE"] = "full"
    import torch

    import common
    import norms

    kiln = common.fresh_kiln()
    os.makedirs(args.out, exist_ok=True)
    bundle = os.path.join(args.out, "full_tunes.json")
    start = time.time()
    for op in args.ops:
        for hidden in args.hiddens:
            for rows in args.rows:
                run = norms.make_case(op, rows, hidden, kiln)[0]
                run()
                torch.cuda.synchronize()
                del run
                torch.cuda.empty_cache()
                kiln.tune_export(bundle)
                print(f"{op} {rows}x{hidden}: tuned, {time.time() - start:.0f} s in all", flush=True)


def compact_config(config):
    row = [config["vec_bytes"], config["threads_per_row"], config["cta_threads"]]
    if config.get("extra"):
        row.append(config["extra"])
    return row


def compact(args):
    tunes, seen, device = [], set(), None
    for path in args.bundles:
        for entry in json.load(open(path))["entries"]:
            doc = entry["document"]
            if doc.get("mode") != "full":
                continue
            problem, bucket = doc["problem"], doc["bucket_rows"]
            rows = doc.get("rows", bucket)  # tuned before results named their rows: the bucket's
            key = (json.dumps(problem, sort_keys=True), rows)
            if key in seen:
                continue
            seen.add(key)
            if device is None:
                device = {k: doc["device"][k] for k in ("name", "sm", "sm_count", "l2_bytes")}
            elif doc["device"]["name"] != device["name"]:
                sys.exit(f"full_tunes.py compact: expected every tune from {device['name']}, "
                         f"got {doc['device']['name']} in {path}")
            trials = [[compact_config(t["config"]), round(t["median_us"], 3)]
                      for t in doc["trials"] if t["status"] == "ok"]
            tunes.append({"problem": problem, "bucket_rows": bucket, "rows": rows,
                          "trials": trials})
    if not tunes:
        sys.exit("full_tunes.py compact: expected full tunes in the bundles, found none")
    ops = sorted({t["problem"]["op"] for t in tunes})
    about = (f"Full tunes of {', '.join(ops)} ({len(tunes)} problems and row counts), "
             f"{device['name']}{', ' + args.date if args.date else ''}: every config "
             "as [vec_bytes, threads_per_row, cta_threads, extras?] with its median us, "
             "timed on `rows` rows")
    with open(args.output, "w") as out:
        out.write('{"about": ' + json.dumps(about) + ',\n "device": ' + json.dumps(device) +
                  ',\n "tunes": [\n')
        out.write(",\n".join("  " + json.dumps(t, sort_keys=True, separators=(",", ":"))
                             for t in tunes))
        out.write("\n ]}\n")
    print(f"{len(tunes)} full tunes written to {args.output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="full tunes on this GPU, exported as a bundle")
    rec.add_argument("--out", required=True)
    rec.add_argument("--ops", nargs="+", default=NORM_OPS, choices=NORM_OPS)
    rec.add_argument("--hiddens", nargs="+", type=int, default=HIDDENS)
    rec.add_argument("--rows", nargs="+", type=int, default=ROWS)
    com = sub.add_parser("compact", help="bundles to the replay doctest's fixture")
    com.add_argument("bundles", nargs="+")
    com.add_argument("-o", "--output", required=True)
    com.add_argument("--date", help="when the bundles were recorded, for the fixture's note")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
    else:
        compact(args)


if __name__ == "__main__":
    main()

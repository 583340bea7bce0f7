"""kiln's norm backward alone, beside a copy of the same bytes, on the shapes bench/norms.py
--backward builds (one torch.autograd.grad, every input and parameter trained), in any dtype.
For comparing two builds of kiln on one machine, each in its own process: install one, run
this, put the other first on PYTHONPATH, run it again, and set each kiln time beside its own
run's copy. torch's autograd of the op (norms.py's "F") is timed beside them too; the
torch.compile peer norms.py builds is skipped (compiling it took longer than the timing).

Usage (GPU machine): python bench/diagnostics/backward_builds.py --dtype float32 --label new"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import norms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32", choices=sorted(norms.DTYPE_KEYS))
    parser.add_argument("--ops", default="rms_norm,layer_norm")
    parser.add_argument("--rows", default="2688,16384")
    parser.add_argument("--hidden", default="2048,4096,14848")
    parser.add_argument("--label", default="kiln", help="names this build in the output")
    args = parser.parse_args()
    dt = getattr(torch, args.dtype)
    kiln = common.fresh_kiln(1024)
    print(f"{args.label}: kiln from {os.path.dirname(kiln.__file__)}", flush=True)
    results = []
    for op in args.ops.split(","):
        for hidden in (int(v) for v in args.hidden.split(",")):
            for rows in (int(v) for v in args.rows.split(",")):
                fn, peers, moved = norms.make_backward_case(op, rows, hidden, kiln, dt=dt,
                                                           compiled=False)
                with torch.no_grad():
                    times = common.bench_side_by_side(
                        {"kiln": fn, "F": peers["F"], "copy": common.same_bytes_copy(moved)})
                results.append({"op": op, "rows": rows, "hidden": hidden, "bytes": moved,
                                **{f"{k}_us": v * 1e3 for k, v in times.items()}})
                r = results[-1]
                print(f"{args.label} {op} {rows}x{hidden} {args.dtype}: kiln {r['kiln_us']:.2f} us, "
                      f"F {r['F_us']:.2f} us, copy {r['copy_us']:.2f} us, "
                      f"kiln {r['kiln_us'] / r['copy_us']:.3f}x copy", flush=True)
    print(json.dumps({"label": args.label, "dtype": args.dtype, "environment": common.environment(),
                      "results": results}))


if __name__ == "__main__":
    main()

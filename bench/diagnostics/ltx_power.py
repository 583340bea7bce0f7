"""The GPU's clock and power while LTX-Video transformer forwards run back to back, eager and
eager + kiln in turn: shows the board power limit lowering the clock more for the forward
with less memory-bound work (BENCHMARKS.md, "The power limit at 161 frames").

Usage: python bench/diagnostics/ltx_power.py [--frames 161] [--rounds 2]
Needs a GPU, nvidia-smi and diffusers. Clocks are sampled as the machine has them: nothing is
locked or reset.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import common  # noqa: E402
import ltx_video  # noqa: E402

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def sampled(fn, forwards):
    """(forward ms list, SM MHz samples, W samples, throttle-reason counts) over `forwards`
    timed forwards, nvidia-smi sampling every 20 ms; the first fifth of samples (the ramp) is
    dropped."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    ms = [common.model_times(fn, 0, 3, warmup_s=0)["ms"] for _ in range(forwards)]
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].strip().splitlines()]
    rows = rows[len(rows) // 5:]
    reasons = {}
    for row in rows:
        reasons[row[2]] = reasons.get(row[2], 0) + 1
    return ms, [float(r[0]) for r in rows], [float(r[1]) for r in rows], reasons


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=161)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import kiln

    with torch.no_grad():
        model = ltx_video.build_model()
        inputs = ltx_video.build_inputs(model.config, args.frames)

        def forward():
            return ltx_video.forward(model, inputs)

        for _ in range(args.rounds):
            for patched in (False, True):
                (kiln.patch if patched else kiln.unpatch)(model)
                forward()
                torch.cuda.synchronize()
                ms, sm, watts, reasons = sampled(forward, 6)
                print(f"{'eager+kiln' if patched else 'eager':10s} forward ms {statistics.median(ms):7.2f} | "
                      f"SM MHz median {statistics.median(sm):.0f} (min {min(sm):.0f}) | "
                      f"W median {statistics.median(watts):.1f} | throttle reasons {reasons}")


if __name__ == "__main__":
    main()

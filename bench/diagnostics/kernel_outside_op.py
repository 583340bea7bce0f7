"""kiln's RMSNorm op beside its own compiled kernel launched outside the op, timed as the
benches time kiln (bench/common.py: the L2 flush before every call, CUDA events around it,
interleaved rounds), to separate the kernel's time from what the op call adds around it.

Contenders, 4096-wide bf16 rows with weight, kiln untuned (its heuristic config) so that the op
runs the very kernel loaded here:
- kiln:              kiln.rms_norm, a new output tensor each call (as every caller gets);
- kernel:            the same cubin (kiln.compile) launched through the driver API into one
                     output buffer allocated once;
- kernel, PDL:       the same, launched with programmatic stream serialization as kiln does
                     (sm_90 and later);
- kernel, fresh out: the same, into a new torch.empty_like(x) each call;
- hand-written:      a minimal RMSNorm of the same geometry (one row a CTA of 128 threads, 4
                     vectors each) into the fixed buffer, plain and (", PDL") as kiln launches;
- copy:              the benches' same-size copy (common.same_bytes_copy: one fixed buffer);
- with --touch, the hand-written kernel into a new tensor each call, as it is and with its
  output row touched at entry (a load of its first word), to see whether starting the new
  output's address translation early recovers what the new tensor costs.

--placement puts x and the outputs in one allocation and writes outputs placed at several
offsets past x's end (and the fixed buffer): the kernel, PyTorch's copy_ of x, and with --touch
the hand-written kernel plain and touched, each into every output. --compare-cubin FILE adds,
wherever the kernel runs, a cubin of the same kernel from another kiln build (`kiln compile
--format cubin` of that build's CLI), to compare a template change with its base in one
process: a kernel's time at a launch-bound shape moves by more between processes and output
addresses than such changes do.

Usage on a GPU machine with kiln installed:
  python bench/diagnostics/kernel_outside_op.py [--rows 128] [--rounds 3] [--touch]
      [--placement] [--compare-cubin FILE]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
from torch.utils.cpp_extension import load  # noqa: E402

import common  # noqa: E402

HIDDEN = 4096
EPS = 1e-6
MIB = 1 << 20
PLACEMENT_MIB = (0, 1 / 16, 1, 3, 8, 16)  # where --placement's outputs start past x's end


def placed(x):
    """x copied to the start of one allocation, and {name: output of x's shape} starting
    PLACEMENT_MIB past x's end in the same allocation."""
    size = x.numel()
    pool = torch.empty(2 * size + int(max(PLACEMENT_MIB) * MIB) // x.element_size(),
                       dtype=x.dtype, device=x.device)
    outputs = {}
    for mib in PLACEMENT_MIB:
        start = size + int(mib * MIB) // x.element_size()
        outputs[f"x's end + {mib:g} MiB"] = pool[start:start + size].view_as(x)
    return pool[:size].view_as(x).copy_(x), outputs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--touch", action="store_true", help="add the touched-output contenders")
    parser.add_argument("--placement", action="store_true",
                        help="outputs at several offsets past x, in one allocation with it")
    parser.add_argument("--compare-cubin", help="the same kernel from another kiln build")
    args = parser.parse_args()
    kiln = common.fresh_kiln()
    kiln.configure(tune="off")
    outside = load("kernel_outside_op", [os.path.join(HERE, "kernel_outside_op.cu")],
                   extra_include_paths=[os.path.join(HERE, "..", "..", "templates")],
                   extra_ldflags=["-lcuda"], verbose=False)
    config = {"vec_bytes": 16, "threads_per_row": 128, "cta_threads": 128}  # the heuristic's
    major, minor = torch.cuda.get_device_capability()
    compiled = kiln.compile("rms_norm", "bf16", HIDDEN, f"sm_{major}{minor}", True, "cubin", 16,
                            config)
    print({k: v for k, v in compiled.items() if k not in ("binary", "log")})

    torch.manual_seed(0)
    x = torch.randn(args.rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(torch.bfloat16)
    out = torch.empty_like(x)
    torch.cuda.synchronize()  # the context exists before the module is loaded into it
    kernel = outside.load_kernel(bytes(compiled["binary"]), compiled["lowered_name"], 128)
    other = None
    if args.compare_cubin:
        with open(args.compare_cubin, "rb") as image:
            other = outside.load_kernel(image.read(), compiled["lowered_name"], 128)

    if args.placement:
        x, outputs = placed(x)
        outputs["fixed buffer"] = out
        fns = {"copy": common.same_bytes_copy(2 * x.numel() * x.element_size())}
        for where, o in outputs.items():
            fns[f"kernel, {where}"] = lambda o=o: outside.launch(x, w, o, EPS, True, kernel)
            if other is not None:
                fns[f"other kernel, {where}"] = (
                    lambda o=o: outside.launch(x, w, o, EPS, True, other))
            fns[f"copy_, {where}"] = lambda o=o: o.copy_(x)
            for touch in (False, True) if args.touch else ():
                fns[f"hand-written{', touched' if touch else ''}, {where}"] = (
                    lambda o=o, touch=touch: outside.launch_minimal(x, w, o, EPS, False, touch))
    else:
        fns = {
            "kiln": lambda: kiln.rms_norm(x, w, EPS),
            "kernel": lambda: outside.launch(x, w, out, EPS, False, kernel),
            "kernel, PDL": lambda: outside.launch(x, w, out, EPS, True, kernel),
            "kernel, fresh out": (
                lambda: outside.launch(x, w, torch.empty_like(x), EPS, True, kernel)),
            "hand-written": lambda: outside.launch_minimal(x, w, out, EPS, False, False),
            "hand-written, PDL": lambda: outside.launch_minimal(x, w, out, EPS, True, False),
            "copy": common.same_bytes_copy(2 * x.numel() * x.element_size()),
        }
        if other is not None:
            fns["other kernel, PDL"] = lambda: outside.launch(x, w, out, EPS, True, other)
            fns["other kernel, fresh out"] = (
                lambda: outside.launch(x, w, torch.empty_like(x), EPS, True, other))
        if args.touch:
            for touch in (False, True):
                name = "hand-written, fresh out" + (", touched" if touch else "")
                fns[name] = (lambda touch=touch: outside.launch_minimal(
                    x, w, torch.empty_like(x), EPS, False, touch))
    reference = kiln.rms_norm(x, w, EPS).float()

    def max_error(launch):
        result = torch.full_like(x, float("nan"))
        launch(result)
        torch.cuda.synchronize()
        return (result.float() - reference).abs().max().item()

    for programmatic in (False, True):
        error = max_error(lambda o: outside.launch(x, w, o, EPS, programmatic, kernel))
        if error != 0.0:
            raise SystemExit(f"the kernel launched here differs from the op: max error {error}")
    if other is not None:
        error = max_error(lambda o: outside.launch(x, w, o, EPS, True, other))
        print(f"the other kernel's max difference from the op: {error}")
        if not error < 0.02:
            raise SystemExit("the other kernel is wrong")
    # The hand-written sum runs in another order (bf16 rounding apart). Into NaNs, the touched
    # word's mantissa bits are still finite, so the touch adds 0.
    for programmatic, touch in ((False, False), (True, False), (False, True)):
        error = max_error(lambda o: outside.launch_minimal(x, w, o, EPS, programmatic, touch))
        if not error < 0.02:
            raise SystemExit(f"the hand-written kernel is wrong: max error {error}")
    print(f"{args.rows} x {HIDDEN}, us (median of interleaved calls), fastest first")
    for round_index in range(args.rounds):
        times = common.bench_side_by_side(fns)
        print(f"round {round_index}: " + ", ".join(
            f"{name} {ms * 1e3:.2f}" for name, ms in sorted(times.items(), key=lambda kv: kv[1])))


if __name__ == "__main__":
    main()

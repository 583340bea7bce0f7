"""Where a norm backward's time goes: the GPU kernels one `torch.autograd.grad` launches, for
kiln and for Liger-Kernel, with each kernel's mean time over repeated calls (torch.profiler),
beside the call's side-by-side time (bench/libraries.py's timing).

Usage (GPU machine): python bench/diagnostics/backward_kernels.py [op] [rows] [hidden]
  op: rms_norm | fused_add_rms_norm | layer_norm (default layer_norm 4096 8192)."""

import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import libraries  # noqa: E402


def kernel_times(call, repeats=20):
    """{kernel name: mean us per call} over `repeats` calls, in launch order."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    totals = collections.OrderedDict()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / repeats
    return totals


def main():
    op = sys.argv[1] if len(sys.argv) > 1 else "layer_norm"
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    hidden = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    if libraries.LIGER is None:
        print("backward_kernels: liger_kernel is not installed")
        return
    kiln = common.fresh_kiln()
    mine, theirs, inputs, _, moved, label = libraries.make_case(op, (rows, hidden), kiln)
    calls = {}
    for name, fn in (("kiln", mine), ("liger", theirs)):
        calls[name], _ = libraries.backward_calls(fn, inputs, seed=1)
    times = common.bench_side_by_side(dict(calls, copy=common.same_bytes_copy(moved)))
    print(f"{op} {label} backward, {moved / 1e6:.1f} MB: " +
          ", ".join(f"{n} {t * 1e3:.2f} us" for n, t in times.items()))
    for name, call in calls.items():
        print(f"\n{name}: kernels of one backward (mean us over 20 calls, no flush)")
        for kernel, us in kernel_times(call).items():
            print(f"  {us:8.2f}  {kernel[:150]}")


if __name__ == "__main__":
    main()

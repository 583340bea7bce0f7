"""Named calls run once each between cudaProfilerStart and Stop, under NVTX ranges of their
names, after warm-up calls that fill kiln's cache (tunes included) and compile Inductor's
kernels: a profiler that starts there (`ncu --profile-from-start off`) sees one launch of each
and nothing of the tuning or compiling."""

import torch


def profile_once(calls, warmups=1):
    """Runs each (name, call) of `calls` `warmups` times, then once under the profiler; prints
    the names in launch order."""
    calls = list(calls)
    for _ in range(warmups):
        for _, call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("\n".join(name for name, _ in calls))

"""Shared pieces of kiln's benchmarks: timing (triton's do_bench, L2 flushed between
repetitions, median), the copy-bandwidth ceiling measured in the same run, and the record
of where and with what a result was measured."""

import datetime
import json
import os
import platform
import subprocess
import tempfile

import torch


def bench_ms(fn, warmup=25, rep=100):
    """Median milliseconds of fn() by CUDA events, L2 flushed between repetitions."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_bandwidth_gbs(size_bytes=1 << 30):
    """Device-to-device copy of `size_bytes`, counting bytes read + written."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * size_bytes / (ms * 1e-3) / 1e9


def host_overhead_us(fn, calls=2000):
    """Host wall time per call of a tiny op, synchronising only at the end."""
    import time

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def environment():
    props = torch.cuda.get_device_properties(0)
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("triton", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "date": datetime.date.today().isoformat(),
        "device": props.name,
        "sm": f"sm_{props.major}{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver": driver,
        "versions": versions,
    }


def write_json(path, document):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


def fresh_kiln(recompile_limit=1024):
    """kiln on a fresh, empty cache (so each specialisation's first call is a true cold
    start), with torch.compile allowed one static compile per shape, as a user with fixed
    shapes gets (never the eager fallback). Returns the kiln module."""
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-bench-")
    import kiln
    import torch._dynamo

    kiln.configure(cache_dir=os.environ["KILN_CACHE_DIR"])
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, recompile_limit)
    return kiln


def stamp(env):
    """The date-device part of result file names: "2026-11-22-NVIDIA_H200"."""
    return f"{env['date']}-{env['device'].replace(' ', '_')}"

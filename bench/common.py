"""Shared pieces of kiln's benchmarks: timing (CUDA events, L2 flushed before every call,
median; contenders interleaved round by round), the copy-bandwidth ceiling measured in the
same run, and the record of where and with what a result was measured."""

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time

import torch

# The names kiln's cache keys and the result files give the dtypes a bench takes.
DTYPE_KEYS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _scrub_enabled():
    return os.environ.get("KILN_BENCH_SCRUB", "1") != "0"


def flush_description():
    """What l2_flush runs before every timed call, as recorded with every result."""
    return ("a 256 MB read with L2 evict_last priority and then a 256 MB memset before every "
            "call" if _scrub_enabled() else
            "a 256 MB memset flushing L2 before every call (KILN_BENCH_SCRUB=0: no scrub)")


def timing_description():
    """How bench_side_by_side times, as recorded with every result."""
    return (f"median of CUDA-event times, {flush_description()}, the contenders of a shape "
            "interleaved in shuffled rounds (bench_side_by_side)")


def _sleep_cycles_per_ms():
    """The GPU clock cycles torch.cuda._sleep spins per millisecond, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1 << 20)
    end.record()
    torch.cuda.synchronize()
    return (1 << 20) / start.elapsed_time(end)


_SCRUB_KERNEL = None


def _evict_last_scrub():
    """A read of a 256 MB buffer with L2 evict_last priority, run before each call's memset
    flush (None with KILN_BENCH_SCRUB=0).

    Why: the 256 MB memset that do_bench flushes with does not evict what the previous call
    read. On an H200 an 88 MB `rms_norm_rope` took 28.1 us after the memset alone, 25.5 us when
    its q and k had been read with evict_last before it, and 26.7 us when they had been read
    plainly. Contenders in the same rounds read the same inputs, so each could start partly
    warm from whichever ran before it. After this read the earlier evict_last lines are gone
    (24.4 us with or without the earlier read, under this read as the only flush); the memset
    after it then leaves the L2 dirty, as do_bench leaves it. torch has no load with an L2
    priority, so the read is a Triton kernel."""
    global _SCRUB_KERNEL
    if not _scrub_enabled():
        return None
    import triton
    import triton.language as tl

    if _SCRUB_KERNEL is None:
        @triton.jit
        def read_evict_last(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
            tl.store(out_ptr + pid, tl.sum(v))
        _SCRUB_KERNEL = read_evict_last

    block = 4096
    buf = torch.zeros(int(256e6 // 4), dtype=torch.int32, device="cuda")
    grid = (triton.cdiv(buf.numel(), block),)
    out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    return lambda: _SCRUB_KERNEL[grid](buf, out, buf.numel(), BLOCK=block)


def l2_flush():
    """A callable that empties L2 as the benches do before every timed call: the evict_last
    scrub (_evict_last_scrub; skipped with KILN_BENCH_SCRUB=0), then a 256 MB memset. Its
    Triton kernel is compiled here, outside any timing."""
    buffer = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    scrub = _evict_last_scrub()
    if scrub is not None:
        scrub()

    def run():
        if scrub is not None:
            scrub()
        buffer.zero_()
    return run


def bench_side_by_side(fns, warmup=25, rep=100, max_rounds=400, seed=0, chunk=25):
    """{name: median milliseconds} of each fn() in `fns`, timed as do_bench times one (CUDA
    events around the call, a 256 MB memset flushing L2 before it, here preceded by the
    evict_last scrub, _evict_last_scrub), but in interleaved rounds:
    each round calls every contender once, in an order shuffled with a fixed seed; about `rep`
    ms of calls per contender, at most `max_rounds` rounds.

    Why not one do_bench block per contender: after an L2 flush a microsecond kernel's time
    alternates between two levels from one call to the next (bench/diagnostics reproduces it),
    and a block of calls settles on a level set by what ran before it. On the H200, blocks
    timed a 1-row RMSNorm 0.7 us apart for kernels whose durations (ncu) and interleaved
    medians agree within 0.3 us. Interleaving puts every contender at every position alike.

    The GPU must never wait for the host inside a timed call, or a contender's dispatch time
    (and a slow peer's, before it) would count. So each chunk of rounds is queued behind a
    GPU sleep longer than the host takes to queue the chunk."""
    import random

    names = list(fns)
    # Made first: its scrub's compile would otherwise count in the host's round time measured
    # below, and every GPU sleep scales with that.
    flush = l2_flush()
    for fn in fns.values():  # first calls compile, tune and allocate outside the timing
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles_per_ms = _sleep_cycles_per_ms()

    def one_round(order, events=None):
        for i, name in enumerate(order):
            flush()
            if events is None:
                fns[name]()
            else:
                begin, finish = events[i]
                begin.record()
                fns[name]()
                finish.record()

    host = time.perf_counter()
    start.record()
    for _ in range(3):
        one_round(names)
    end.record()
    torch.cuda.synchronize()
    host_round_ms = (time.perf_counter() - host) * 1e3 / 3
    round_ms = max(start.elapsed_time(end) / 3, 1e-3)
    warm_rounds = max(1, int(warmup / round_ms))
    rounds = max(10, min(max_rounds, int(rep / (round_ms / len(names)))))
    order = random.Random(seed)
    times = {name: [] for name in names}
    # A chunk that queues more work than the launch queue holds blocks the host until the GPU
    # has drained the sleep ahead of it, and the host time measured for that chunk, grown by
    # the sleep, would lengthen the next sleep in turn. About six entries a contender (scrub,
    # flush, two events, the call). The growth of the measured host time is bounded for the
    # same reason. With both, an H200 call of 15 contenders took 1-2 s where it had taken 150.
    chunk = max(1, min(chunk, 240 // (6 * len(names))))
    first_host_round_ms = host_round_ms
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(chunk * len(names))]
    for _ in range(warm_rounds):
        one_round(names)
    done = 0
    while done < rounds:
        count = min(chunk, rounds - done)
        torch.cuda._sleep(int(cycles_per_ms * (1.5 * host_round_ms * count + 0.5)))
        host = time.perf_counter()
        pending = []
        for r in range(count):
            shuffled = names[:]
            order.shuffle(shuffled)
            chunk_events = events[r * len(names):(r + 1) * len(names)]
            one_round(shuffled, chunk_events)
            pending += zip(shuffled, chunk_events)
        host_round_ms = max(host_round_ms, min((time.perf_counter() - host) * 1e3 / count,
                                               4 * first_host_round_ms))
        torch.cuda.synchronize()
        for name, (begin, finish) in pending:
            times[name].append(begin.elapsed_time(finish))
        done += count
    return {name: statistics.median(values) for name, values in times.items()}


SUSTAINED_TIMING = ("CUDA events around a block of calls queued back to back behind a GPU "
                    "sleep, consecutive calls on different copies of the inputs (together at least 3x "
                    "L2), time per call = block time / calls, median of shuffled rounds "
                    "(bench_sustained)")


def input_sets_for(moved):
    """How many copies of a call's inputs consecutive sustained calls cycle through, so that a
    call never finds its inputs left in L2 by an earlier call: together they move at least
    three times the L2's bytes."""
    import math

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, math.ceil(3 * l2 / max(moved, 1)))


def bench_sustained(sets, block_ms=1.5, max_calls=256, rounds=9, seed=0):
    """{name: median milliseconds per call} of each contender called back to back, as a
    model's forward issues its ops: the host queues a block of calls behind a GPU sleep that
    outlasts the queueing, so the GPU runs them without waiting, and CUDA events around the
    block give its time, divided by the calls. `sets` is a list of {name: fn}, one per copy of
    the inputs (`input_sets_for`); a block cycles through them, so each call reads inputs
    that are in DRAM, not L2, and writes back what the calls before it left dirty.

    What this measures, beside bench_side_by_side's single calls after an L2 flush: the rate
    a kernel streams at once its launch overlaps the call before it. A single call pays about
    4 us of launch and, after the memset flush, the write-back of the flush's dirty lines, so
    timed that way no kernel under 88 MB, not even a copy, reaches 80% of a 1 GiB copy's
    bandwidth (bench/copy_floor.py). What this timing leaves is each call's ramp-up and tail
    (about 3 us on the H200), which no timing removes."""
    import random

    names = list(sets[0])
    for fns in sets:  # first calls compile, tune and allocate outside the timing
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    cycles_per_ms = _sleep_cycles_per_ms()

    def block(name, calls, sleep_ms):
        if sleep_ms:
            torch.cuda._sleep(int(cycles_per_ms * sleep_ms))
        begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()
        begin.record()
        for i in range(calls):
            sets[i % len(sets)][name]()
        finish.record()
        return begin, finish, (time.perf_counter() - host) * 1e3 / calls

    calls, host_ms = {}, {}
    for name in names:  # one unslept pass: the host's time per call and a first GPU time
        begin, finish, host_ms[name] = block(name, 2 * len(sets), 0)
        torch.cuda.synchronize()
        gpu_ms = begin.elapsed_time(finish) / (2 * len(sets))
        wanted = max(len(sets), min(max_calls, int(block_ms / max(gpu_ms, 1e-4))))
        calls[name] = wanted - wanted % len(sets)
    order = random.Random(seed)
    times = {name: [] for name in names}
    for _ in range(rounds):
        shuffled = names[:]
        order.shuffle(shuffled)
        pending = []
        for name in shuffled:
            begin, finish, host = block(name, calls[name], 1.5 * host_ms[name] * calls[name] + 0.2)
            host_ms[name] = max(host_ms[name], host)
            pending.append((name, begin, finish))
        torch.cuda.synchronize()
        for name, begin, finish in pending:
            times[name].append(begin.elapsed_time(finish) / calls[name])
    return {name: statistics.median(values) for name, values in times.items()}


def sustained_copy_bandwidth_gbs(size_bytes=1 << 30):
    """The 1 GiB device-to-device copy's bandwidth timed by bench_sustained (read + written)."""
    sets = [{"copy": same_bytes_copy(2 * size_bytes)} for _ in range(input_sets_for(2 * size_bytes))]
    ms = bench_sustained(sets)["copy"]
    return 2 * size_bytes / (ms * 1e-3) / 1e9


def copy_bandwidth_gbs(size_bytes=1 << 30):
    """Device-to-device copy of `size_bytes`, counting bytes read + written."""
    ms = bench_side_by_side({"copy": same_bytes_copy(2 * size_bytes)})["copy"]
    return 2 * size_bytes / (ms * 1e-3) / 1e9


def same_bytes_copy(moved):
    """A device-to-device copy of `moved` bytes (half read, half written), to time beside a
    kernel: what the memory system gives a kernel of this size, launch and ramp included.
    Below a few hundred MB that is less than the 1 GiB copy's bandwidth, so it says how much
    of a kernel's distance to the copy ceiling no kernel of that size can close."""
    src = torch.empty(max(moved // 2, 1), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def peer_row(name, moved, times_ms, copy_ms, copy_gbs):
    """One case's record from bench_side_by_side's medians (ms, the copy's taken out): each
    contender's time in us and % of the copy bandwidth, the same-size copy's time, and kiln's
    speedup over the best peer (the contenders not named kiln...)."""
    best_peer = min(v for k, v in times_ms.items() if not k.startswith("kiln"))
    return {
        "case": name,
        "bytes": moved,
        "us": {k: v * 1e3 for k, v in times_ms.items()},
        "copy_same_bytes_us": copy_ms * 1e3,
        "pct_of_copy": {k: 100 * moved / (v * 1e-3) / 1e9 / copy_gbs for k, v in times_ms.items()},
        "speedup_vs_best_peer": best_peer / times_ms["kiln"],
    }


def time_against_copy(name, moved, contenders, copy_gbs):
    """Times `contenders` (kiln's and the peers') and a copy of `moved` bytes side by side, and
    returns the case's peer_row."""
    copy = "copy of the same bytes"
    times = bench_side_by_side({**contenders, copy: same_bytes_copy(moved)})
    copy_ms = times.pop(copy)
    return peer_row(name, moved, times, copy_ms, copy_gbs)


def eager_compiled_bench(prefix, title, cases, out, tag="", check="rel_err_vs_peer", check_title="rel err"):
    """A bench of kiln beside an eager peer and torch.compile of it (one peer named "eager...",
    one "compiled"), each case timed against a same-size copy (time_against_copy), its error
    (`check`: the case's check()) and the tunes it made recorded, and host time called back to
    back where the case is launch-bound. Writes out/<prefix>-<stamp>[-tag].{json,md} under
    `title` (what the table measures) and prints the table last."""
    kiln = fresh_kiln(256)
    env = environment()
    copy_gbs = copy_bandwidth_gbs()
    tunes, seen = tune_dir(kiln), set()
    rows = []
    with torch.no_grad():
        for case in cases:
            contenders = {"kiln": case["kiln"], **case["peers"]}
            row = time_against_copy(case["name"], case["bytes"], contenders, copy_gbs)
            row[check] = case["check"]()
            row["kiln_tuned"] = tuned_configs(tunes, seen)
            if case["launch_bound"]:
                row["host_us"] = host_side_by_side(contenders)
            rows.append(row)
            print(row["case"], f"{row['us']['kiln']:.1f} us", f"{row['speedup_vs_best_peer']:.2f}x", flush=True)
    geomean = geomean_speedup(rows)
    result = {"environment": env, "copy_gbs": copy_gbs, f"{prefix}_bf16": rows,
              "geomean_speedup_vs_best_peer": geomean, "kiln_settings": kiln.settings()}
    named = stamp(env) + (f"-{tag}" if tag else "")
    write_json(os.path.join(out, f"{prefix}-{named}.json"), result)
    lines = [
        f"{title}, bf16, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}, "
        f"triton {env['versions'].get('triton', '-')}, transformers {env['versions'].get('transformers', '-')}; "
        f"copy {copy_gbs:.0f} GB/s; {timing_description()}",
        "",
        "| case | MB | kiln us (% copy) | eager us | compiled us (% copy) | kiln vs best peer "
        f"| copy of same MB us | {check_title} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        us, pct = r["us"], r["pct_of_copy"]
        eager = next(k for k in us if k.startswith("eager"))
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.1f} | {us['kiln']:.1f} ({pct['kiln']:.0f}%) "
                     f"| {us[eager]:.1f} | {us['compiled']:.1f} ({pct['compiled']:.0f}%) "
                     f"| {r['speedup_vs_best_peer']:.2f}x | {r['copy_same_bytes_us']:.1f} | {r[check]:.1e} |")
    lines += host_lines(rows, ["kiln", "eager", "compiled"])
    lines += ["", f"Geometric mean of kiln vs the best peer: {geomean:.2f}x"]
    table = "\n".join(lines)
    with open(os.path.join(out, f"{prefix}-{named}.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return rows


def geomean_speedup(rows):
    return math.exp(sum(math.log(r["speedup_vs_best_peer"]) for r in rows) / len(rows))


def host_lines(rows, columns):
    """The back-to-back host table of the rows that were timed so (host_us), in `columns`
    (the contenders' names; "eager" stands for the row's eager contender, whatever its source)."""
    host = [r for r in rows if "host_us" in r]
    if not host:
        return []
    lines = ["", "Called back to back (host wall time per call, us):", "",
             "| case | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for r in host:
        h = r["host_us"]
        keys = [next(k for k in h if k.startswith("eager")) if c == "eager" else c for c in columns]
        lines.append(f"| {r['case']} | " + " | ".join(f"{h[k]:.1f}" for k in keys) + " |")
    return lines


def host_side_by_side(fns, calls=200, rounds=15):
    """{name: host wall time per call, us}: each function called `calls` times back to back
    (synchronising only at the end of the block), the functions interleaved in `rounds`
    rounds, the median block taken, so a noisy stretch of the host weighs on every
    contender alike instead of on one."""
    import statistics

    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    blocks = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            blocks[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(times) for name, times in blocks.items()}


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
        "timing": timing_description(),
    }


def first_call_ms(fn):
    """Host wall time of one call of fn, the device synchronized before and after: what a
    first call (compile, tune or disk read included) costs the caller."""

    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - start) * 1e3


def write_json(path, document):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


def patch_leaving(kiln, detect_module, leave=None):
    """A patch function for run_model_settings' variants: kiln.patch with the candidates of
    ``detect_module`` (one of kiln.patching's detect modules) whose classifier is in ``leave``
    (all of them where None) left to the model: what those patterns give."""
    def patch(model):
        kept = detect_module.CANDIDATES
        detect_module.CANDIDATES = tuple(pair for pair in kept if leave is not None and pair[1] not in leave)
        try:
            return kiln.patch(model)
        finally:
            detect_module.CANDIDATES = kept
    return patch


def bf16_diffusers_model(cls, config, device="cuda", seed=0, norm_spread=0.1):
    """diffusers' ``cls`` (its name) of ``config``, built in bf16 (a large model's fp32 copy is
    never made) on ``device`` after ``torch.manual_seed(seed)``, its norms' parameters given a
    random spread of ``norm_spread`` (they start at 1 and 0); in eval mode."""
    import diffusers

    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = getattr(diffusers, cls)(**config)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "norm" in name:
                        p.add_(norm_spread * torch.randn_like(p))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


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


def tune_dir(kiln):
    """Where kiln's cache keeps this device's tune records."""
    return os.path.join(kiln.settings()["cache_dir"], "v1", "tune", kiln.device_info(0)["fingerprint"])


def tuned_configs(directory, seen):
    """The winners of the tunes stored in `directory` since the last call: {file name: reason}."""
    found = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(directory, name)) as f:
            found[name] = json.load(f).get("reason", "")
    return found


def stamp(env):
    """The date-device part of result file names: "2026-11-22-NVIDIA_H200"."""
    return f"{env['date']}-{env['device'].replace(' ', '_')}"


def write_diagnostics(out, name, env, tag, table):
    """Writes a diagnostic's printed table to OUT/<name>-<stamp>[-tag]-diagnostics.md and
    prints it."""
    path = os.path.join(out, f"{name}-{stamp(env)}{f'-{tag}' if tag else ''}-diagnostics.md")
    with open(path, "w") as f:
        f.write(table + "\n")
    print(table)


# ---- whole-model benchmarks (bench/ltx_video.py, bench/llama.py) -----------------------


def model_environment(device):
    """environment() on a GPU; on the CPU (the benchmarks' smoke runs) the same keys with
    what the CPU can say. Adds the versions of the model libraries."""
    if device == "cuda":
        env = environment()
    else:
        env = {"date": datetime.date.today().isoformat(), "device": f"cpu ({platform.machine()})", "sm": "-",
               "sm_count": 0, "driver": "-",
               "versions": {"torch": torch.__version__, "python": platform.python_version()}}
    for name in ("transformers", "diffusers", "accelerate"):
        try:
            env["versions"][name] = __import__(name).__version__
        except ImportError:
            pass
    return env


def model_times(fn, warmup, reps, warmup_s=1.0):
    """Median milliseconds of fn() over `reps` calls after `warmup` calls and at least
    `warmup_s` seconds of calls back to back, each call timed alone: by CUDA events on a GPU
    (no L2 flush: a model's layers do not fit in L2 and run back to back in use), by the host
    clock on the CPU. The warm-up is timed as well as counted because a few calls are not
    enough after a pause (a compile, kiln's tuning): host and GPU take about a second to
    come back to speed, and a setting timed within it measures that, not itself.

    Returns {"ms", "host_ms"}: host_ms is the median time the host takes to issue one call
    (to return from it, before the GPU finishes). Where it comes near ms, the call is
    host-bound: the GPU waits for the host, and a slower host makes it slower."""
    import statistics

    start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - start < warmup_s:
        fn()
        _sync()
        done += 1
    times, host = [], []
    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    _sync()
    for _ in range(reps):
        if on_gpu:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        issued = time.perf_counter()
        fn()
        host.append((time.perf_counter() - issued) * 1e3)
        if on_gpu:
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            times.append(host[-1])
    return {"ms": statistics.median(times), "host_ms": statistics.median(host)}


def kernel_ms(fn, calls=5):
    """The GPU time of fn()'s kernels per call, in ms: the sum of every kernel's duration under
    torch.profiler over `calls` calls, divided by `calls`. A host-bound call's CUDA-event time
    is its host's, which moves by tens of percent between processes; this is what the GPU
    itself spends on it. None off the GPU."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        _sync()
    total_us = sum(e.time_range.elapsed_us() for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / calls / 1e3


def relative_errors(actual, expected):
    """How far `actual` is from `expected`, in fp64, relative to expected's own scale:
    max |a - e| / max |e| and mean |a - e| / mean |e| (an element-wise ratio would divide
    by the outputs' near-zero values)."""
    a, e = actual.detach().double().flatten(), expected.detach().double().flatten()
    if a.shape != e.shape:
        raise ValueError(f"relative_errors: shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    diff = (a - e).abs()
    return {"max_rel": (diff.max() / e.abs().max()).item(), "mean_rel": (diff.mean() / e.abs().mean()).item(),
            "finite": bool(torch.isfinite(a).all().item())}


SETTINGS = ("eager", "compile", "eager+kiln", "compile+kiln")


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def capture_graph(step, kiln=None):
    """A CUDA graph of step() and the output it writes on replay. Every JIT compile (kiln's,
    torch.compile's autotuning) and lazy allocation must happen before the capture, so step
    runs a few times first on a side stream (as torch.cuda.graphs asks), through
    kiln.warmup where this kiln has it."""
    warmup = getattr(kiln, "warmup", None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if warmup is not None:
            try:
                warmup(step)
            except (TypeError, AttributeError) as error:  # another signature: the runs below warm up all the same
                print(f"  kiln.warmup(step) not used: {error}")
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def compile_model(model):
    """torch.compile of the whole model (default mode, one static compile per shape); returns
    what to call and how to undo it."""
    return torch.compile(model, dynamic=False), lambda: None


def compile_blocks(blocks):
    """A compile_model for regional compilation (diffusers' compile_repeated_blocks): each of
    `blocks` compiled in place (nn.Module.compile); identical blocks share one graph, so the
    compile costs one block's, not the whole stack's."""
    def compile_(model):
        for block in blocks:
            block.compile(dynamic=False)

        def undo():
            for block in blocks:
                block._compiled_call_impl = None
        return model, undo
    return compile_


ERRORS = "max_rel = max|out - eager| / max|eager|, mean_rel = mean|out - eager| / mean|eager|"
# How the diffusion transformers' benches time their settings, compiled by block.
BLOCKWISE_TIMING = ("ms = median per forward, each call timed alone after at least 1 s of warm-up calls; host ms = "
                    "median time the host takes to issue one; speedup of eager+kiln over eager and of compile+kiln "
                    f"over compile (compiled by block); {ERRORS}; first call = the compile or kiln's JIT and tuning.")


def blockwise_markdown(heading: str, document: dict) -> str:
    """A diffusion transformer bench's markdown: ``heading`` (what was run, where), how it was timed,
    the settings' table."""
    return "\n".join([f"{heading} {BLOCKWISE_TIMING}", ""] + settings_table(document))


def write_results(out, stem, env, tag, document, table):
    """Writes a bench's record to OUT/<stem>-<stamp><tag>.json (with how its errors are
    measured) and its table to the .md beside it."""
    path = os.path.join(out, f"{stem}-{stamp(env)}{tag}")
    write_json(path + ".json", {**document, "errors": ERRORS})
    with open(path + ".md", "w") as f:
        f.write(table + "\n")


def finish_model_bench(args, stem, env, document, table, started):
    """The end of a model bench's run (bench/flux.py, bench/wan.py, ...): its record and table
    written into --out (write_results), then the run's total time and the table printed."""
    write_results(args.out, stem, env, args.tag, document, table)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(table)


def settings_table(document):
    """The settings rows of a model bench's table (bench/sdxl_unet.py, bench/wan.py): time,
    host time, speedup, errors against eager and first call a setting, then what kiln.patch
    replaced and left."""
    kernels = any("kernel_ms" in s for s in document["settings"].values())
    lines = ["| setting | ms | host ms | " + ("kernel ms | kernels vs base | " if kernels else "")
             + "speedup | max rel err | mean rel err | first call s |",
             "| --- " * (9 if kernels else 7) + "|"]
    for name, s in document["settings"].items():
        err = s.get("error_vs_eager")
        speedup = f"{s['speedup']:.2f}x vs {s['speedup_vs']}" if "speedup" in s else "-"
        errs = f"{err['max_rel']:.2e} | {err['mean_rel']:.2e}" if err else "- | -"
        gpu = ""
        if kernels:
            base = document["settings"].get(s.get("speedup_vs"), {})
            ratio = f"{base['kernel_ms'] / s['kernel_ms']:.2f}x" if "kernel_ms" in base and "kernel_ms" in s else "-"
            gpu = f"{s['kernel_ms']:.3f} | {ratio} | " if "kernel_ms" in s else "- | - | "
        lines.append(f"| {name} | {s['ms']:.3f} | {host_cell(s)} | {gpu}{speedup} | {errs} | {s['first_call_s']:.1f} |")
    if document["patch"]:
        lines += ["", f"kiln.patch: replaced {document['patch']['replaced']}, left {document['patch']['left']}"]
    return lines


def model_settings(text, script):
    """The settings named in a --settings value, or an exit naming the unknown ones."""
    settings = text.split(",")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"{script}: --settings: expected names among {list(SETTINGS)}, got {unknown}")
    return settings


def add_module_bench_arguments(parser):
    """The arguments of a bench of one module's settings (bench/gated_feed_forward.py,
    bench/sdxl_unet.py)."""
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="fewer reps")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes of the same structure (a CPU smoke run)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--tag", default="", help="appended to the output file names")
    parser.add_argument("--settings", default=",".join(SETTINGS))


def run_model_settings(model, call, kiln, *, settings=SETTINGS, warmup=2, reps=10, graphs=False, log=print,
                       compile_fn=compile_model, warmup_s=1.0, variants=None, kernel_times=False):
    """The four settings of an end-to-end benchmark on one model and one input: `eager`
    (the model as built), `compile` (compile_fn(model): torch.compile(model, dynamic=False),
    default mode, unless told otherwise),
    `eager+kiln` (after kiln.patch(model)) and `compile+kiln` (torch.compile of the patched
    model). call(fn) runs one forward of fn (the model or its compiled form) and returns the
    output tensor. Each setting is timed after `warmup` calls and `warmup_s` seconds of calls
    (model_times). With graphs=True each setting is captured in a CUDA graph and its replay
    is timed. `variants` ({name: patch function}) adds eager settings patched another way
    (each timed after the four, against eager). With kernel_times=True each record also has
    "kernel_ms", its kernels' GPU time per forward (kernel_ms). Returns ({setting: record}, the
    kiln.patch report); every output is compared with the unpatched eager output. The model is
    unpatched again on return."""

    records, report, reference = {}, None, None

    def measure(name, fn):
        nonlocal reference
        _sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = call(fn)  # the first call compiles: torch.compile's graph, kiln's kernels
        _sync()
        first_s = time.perf_counter() - start
        graph = None
        with torch.no_grad():
            graph_error = None
            if graphs:
                try:
                    graph, static_out = capture_graph(lambda: call(fn), kiln)
                except RuntimeError as error:  # timed without a graph, and the record says why
                    graph_error = str(error).splitlines()[0]
                    log(f"  {name}: CUDA graph capture failed, timing without: {graph_error}")
                    torch.cuda.synchronize()
            if graph is not None:
                timed = graph.replay
                graph.replay()
                _sync()
                out = static_out.clone()
            else:
                timed = lambda: call(fn)  # noqa: E731
            timing = model_times(timed, warmup, reps, warmup_s)
            ms = timing["ms"]
            gpu_ms = kernel_ms(timed) if kernel_times else None
        graphed = graph is not None
        del graph, timed
        record = {"ms": ms, "host_ms": timing["host_ms"], "first_call_s": first_s, "output_shape": list(out.shape),
                  "cuda_graph": graphed,
                  "warmup": {"calls_at_least": warmup, "seconds_at_least": warmup_s}}
        if graph_error:
            record["cuda_graph_error"] = graph_error
        if gpu_ms is not None:
            record["kernel_ms"] = gpu_ms
        if reference is None:
            reference = out.clone()
        else:
            record["error_vs_eager"] = relative_errors(out, reference)
        records[name] = record
        err = record.get("error_vs_eager")
        log(f"  {name}: {ms:.3f} ms (host {timing['host_ms']:.1f} ms"
            + (f", kernels {gpu_ms:.3f} ms" if gpu_ms is not None else "") + f"), first call {first_s:.1f} s"
            + (f", max rel err {err['max_rel']:.2e}, mean rel err {err['mean_rel']:.2e}" if err else ""))

    def compiled_measure(name):
        import torch._dynamo

        torch._dynamo.reset()
        compiled, undo = compile_fn(model)
        try:
            measure(name, compiled)
        finally:
            undo()
        del compiled
        torch._dynamo.reset()

    try:
        measure("eager", model)  # always: the reference output
        if "compile" in settings:
            compiled_measure("compile")
        if "eager+kiln" in settings or "compile+kiln" in settings:
            report = kiln.patch(model)
            if "eager+kiln" in settings:
                measure("eager+kiln", model)
            if "compile+kiln" in settings:
                compiled_measure("compile+kiln")
        for name, patch in (variants or {}).items():
            kiln.unpatch(model)
            patch(model)
            measure(name, model)
    finally:
        kiln.unpatch(model)
    for name, record in records.items():
        base = "compile" if name == "compile+kiln" else "eager"
        if name != base and base in records:
            record["speedup_vs"] = base
            record["speedup"] = records[base]["ms"] / record["ms"]
    return records, report


def host_cell(record):
    """A table's host-ms cell: the host's time to issue one call ("-" in records made before
    it was measured)."""
    return f"{record['host_ms']:.2f}" if "host_ms" in record else "-"


def patch_summary(report):
    """{kiln op: modules replaced} and the number of candidates left, for the record."""
    if report is None:
        return None
    by_op = {}
    for r in report.replaced:
        by_op[r.op] = by_op.get(r.op, 0) + 1
    return {"replaced": by_op, "left": len(report.left)}

"""Process-wide settings, device information and offline compiles."""

from typing import Optional, Sequence, Union

from . import _C


def device_count() -> int:
    """CUDA devices visible to kiln; 0 where there is no driver or no GPU."""
    try:
        return _C.device_count()
    except RuntimeError:
        return 0


def device_info(device: int = 0) -> dict:
    """What kiln probed of a GPU: name, compute capability, SMs, L2, shared memory, memory
    size, bus width and clock (hence the datasheet bandwidth), driver version and the
    fingerprint its tuning results are keyed by. Raises RuntimeError where there is none."""
    if hasattr(device, "index"):
        device = device.index or 0
    return _C.device_info(int(device))


def compile(op: str = "rms_norm", dtype: str = "bf16", hidden: int = 4096, arch: str = "sm_90",
            weight: bool = True, format: str = "ptx", align: int = 16,
            config: Optional[dict] = None, flags: Optional[int] = None,
            rows: Optional[int] = None, aux: int = 0) -> dict:
    """Compile one specialisation with NVRTC (no GPU needed), through the disk cache.

    Returns a dict with the binary (PTX text or cubin bytes), its cache key, the kernel's
    name expression and lowered name, the config used (the family's heuristic unless
    ``config`` gives vec_bytes, threads_per_row and cta_threads, plus the family's extra
    tunables; with ``rows``, the heuristic for calls of that many rows, as ``KILN_TUNE=off``
    serves them), and the compile time. ``arch="native"``: the GPU's own arch, and its SM
    count for the heuristic (otherwise the arch's typical part's). ``flags`` sets the problem's family bits (see the
    family's header); without it, ``weight`` gives rms_norm's. ``aux``: the problem's second
    size where its family has one (RoPE's rotary dim)."""
    return _C.compile(op, dtype, hidden, arch, weight, format, align, config, flags, rows, aux)


def settings() -> dict:
    """The settings in force: cache_dir, cache_mode (rw|ro|off|strict), tune_mode (off|fast|full),
    record (the KILN_RECORD manifest, "" when not recording), capture (heuristic|error: what a
    kernel first needed during a CUDA graph capture may use), pdl (on|off: programmatic
    dependent launch where the GPU has it)."""
    return _C.settings()


def configure(cache_dir: Optional[str] = None, cache: Optional[str] = None,
              tune: Optional[str] = None, record: Optional[str] = None,
              capture: Optional[str] = None, pdl: Optional[str] = None) -> None:
    """Change settings for this process (the Python spelling of KILN_CACHE_DIR, KILN_CACHE,
    KILN_TUNE, KILN_RECORD, KILN_CAPTURE and KILN_PDL; ``record=""`` stops recording). Kernels
    already resolved are forgotten, so the next call re-resolves.

    ``capture``: what a kernel first needed while a CUDA graph is being captured may use.
    Nothing is ever compiled or tuned inside a capture; ``"heuristic"`` (default) loads the
    tuned config's binary from the cache, else the heuristic config's for the call's rows, else
    the heuristic's for any row count, and raises if none is cached; ``"error"`` raises for any kernel this process has not loaded before the
    capture (so a capture uses exactly what :func:`kiln.warmup` readied).

    ``pdl``: ``"on"`` (default) launches kiln's kernels with programmatic dependent launch on
    GPUs of compute capability 9.0 and newer (with a driver for CUDA 12.3 or newer): a kernel's
    CTAs are placed while the kernel ahead of it on the stream drains, and wait there until it
    has finished, which saves part of a launch per op in a CUDA graph or a busy stream.
    ``"off"`` launches them the plain way. Results are the same either way."""
    _C.set_settings(cache_dir, cache, tune, record, capture, pdl)


def stats() -> dict:
    """Counters of this process: hot-table hits, resolves, compiles by op calls, binaries and
    tuning results read from disk, tunes run; and from the cache layer, every NVRTC compile of
    the process (op calls, tuning, ``compile``, ``prewarm``) with its time, corrupt entries
    found, stores that failed and compile-lock waits."""
    return _C.stats()


def _names(value: Union[str, Sequence]) -> list:
    if isinstance(value, str):
        return [part for part in value.split(",") if part]
    return [str(item) for item in value]


def prewarm(ops: Union[str, Sequence[str]] = (), dtypes: Union[str, Sequence[str]] = "bf16",
            hidden: Union[int, Sequence[int]] = (), archs: Union[str, Sequence[str]] = (),
            config: Optional[str] = None, manifest: Optional[str] = None, jobs: int = 1,
            training: bool = False) -> dict:
    """Compile kernels into the cache ahead of time, with no GPU (the Python spelling of
    ``kiln prewarm``): ops x dtypes x hidden sizes x archs, the ops of a Hugging Face
    ``config`` (a config.json path), and/or the specialisations of a ``manifest`` recorded with
    KILN_RECORD. With ``training``, the backward kernels of those ops too (``--training``).
    Returns the counts (compiled and reused: binaries, a norm having two, its heuristic and its
    config for calls of at most one row per SM; failed: specialisations with a config that did
    not compile), the failures, the time, and notes (ops whose family is not registered are
    skipped with a note)."""
    hiddens = [hidden] if isinstance(hidden, int) else [int(h) for h in hidden]
    return _C.prewarm(_names(ops), _names(dtypes), hiddens, _names(archs), config, manifest,
                      int(jobs), bool(training))


def cache_stats(cache_dir: Optional[str] = None) -> dict:
    """Statistics of a cache summed over every process that used it in rw mode: hits and
    misses of the binary store and of the tuning database, compiles and their time, stores
    and failed stores, corrupt entries, lock waits, evictions; and its size."""
    return _C.cache_stats(cache_dir)


def cache_ls(cache_dir: Optional[str] = None) -> list:
    """The binary entries of a cache (key, path, bytes, last_used), least recently used first."""
    return _C.cache_ls(cache_dir)


def cache_verify(cache_dir: Optional[str] = None) -> dict:
    """Validates every entry of a cache; bad ones are moved aside and counted."""
    return _C.cache_verify(cache_dir)


def cache_trim(max_size: str, cache_dir: Optional[str] = None) -> dict:
    """Removes least recently used binaries until the cache holds at most ``max_size``
    (e.g. "2G"), and stale temp files and moved-aside entries."""
    return _C.cache_trim(str(max_size), cache_dir)


def cache_clear(cache_dir: Optional[str] = None) -> int:
    """Removes everything kiln keeps in a cache; returns the number of files removed."""
    return _C.cache_clear(cache_dir)


def cache_export(bundle: str, cache_dir: Optional[str] = None) -> dict:
    """Copies every valid entry of a cache into the folder ``bundle`` (itself a cache)."""
    return _C.cache_export(str(bundle), cache_dir)


def cache_import(bundle: str, cache_dir: Optional[str] = None) -> dict:
    """Copies every valid entry of the folder ``bundle`` into a cache."""
    return _C.cache_import(str(bundle), cache_dir)


def report(format: str = "md", device: Optional[str] = None, op: Optional[str] = None,
           cache_dir: Optional[str] = None) -> str:
    """The tuning database as text: ``format`` "json" (schema "kiln.report", version 1), "md"
    or "html" (one self-contained page with a bandwidth chart per problem). ``device``: a
    fingerprint, database folder or part of a device name; ``op``: one op family."""
    return _C.report(str(format), device, op, None if cache_dir is None else str(cache_dir))


def tune_export(file: str, device: Optional[str] = None, cache_dir: Optional[str] = None) -> dict:
    """Writes every valid tuning result (of ``device``, or all) to one JSON bundle file."""
    return _C.tune_export(str(file), device, None if cache_dir is None else str(cache_dir))


def tune_import(file: str, cache_dir: Optional[str] = None, pin: bool = False) -> dict:
    """Validates each entry of a bundle written by tune_export and stores the valid ones
    (pinned, with ``pin``); returns the counts (imported, skipped_invalid, failed,
    kept_pinned) and why each was skipped. A result pinned in the cache is never replaced."""
    return _C.tune_import(str(file), None if cache_dir is None else str(cache_dir), bool(pin))


def tune_pin(device: Optional[str] = None, op: Optional[str] = None, problem: Optional[str] = None,
             bucket: Optional[int] = None, config: Optional[str] = None,
             cache_dir: Optional[str] = None) -> dict:
    """Pins the selected tuning results: they are used whatever kiln or NVRTC version runs
    (an unpinned result measured with other versions is tuned again) and never replaced by a
    tune or an import. ``config`` (one result only): make that measured candidate the winner,
    e.g. one chosen from ``kiln.report()``. Returns the entries changed and unchanged."""
    return _C.tune_pin(True, device, op, problem, bucket, config,
                       None if cache_dir is None else str(cache_dir))


def tune_unpin(device: Optional[str] = None, op: Optional[str] = None,
               problem: Optional[str] = None, bucket: Optional[int] = None,
               cache_dir: Optional[str] = None) -> dict:
    """Unpins the selected tuning results (see tune_pin)."""
    return _C.tune_pin(False, device, op, problem, bucket, None,
                       None if cache_dir is None else str(cache_dir))

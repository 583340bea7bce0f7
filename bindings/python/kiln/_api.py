"""Process-wide settings, device information and offline compiles."""

from typing import Optional

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
            config: Optional[dict] = None, flags: Optional[int] = None) -> dict:
    """Compile one specialisation with NVRTC (no GPU needed), through the disk cache.

    Returns a dict with the binary (PTX text or cubin bytes), its cache key, the kernel's
    name expression and lowered name, the config used (the family's heuristic unless
    ``config`` gives vec_bytes, threads_per_row and cta_threads, plus the family's extra
    tunables), and the compile time. ``flags`` sets the problem's family bits (see the
    family's header); without it, ``weight`` gives rms_norm's."""
    return _C.compile(op, dtype, hidden, arch, weight, format, align, config, flags)


def settings() -> dict:
    """The settings in force: cache_dir, cache_mode (rw|ro|off|strict), tune_mode (off|fast|full)."""
    return _C.settings()


def configure(cache_dir: Optional[str] = None, cache: Optional[str] = None,
              tune: Optional[str] = None) -> None:
    """Change settings for this process (the Python spelling of KILN_CACHE_DIR, KILN_CACHE
    and KILN_TUNE). Kernels already resolved are forgotten, so the next call re-resolves."""
    _C.set_settings(cache_dir, cache, tune)


def stats() -> dict:
    """Counters of this process: hot-table hits, resolves, NVRTC compiles, binaries and
    tuning results read from disk, tunes run."""
    return _C.stats()

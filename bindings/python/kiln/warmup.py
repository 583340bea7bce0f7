"""kiln.warmup: ready every kernel a model needs before a CUDA graph capture.

Inside a capture kiln never compiles or tunes (see KILN_CAPTURE in the README): a kernel must
already be loaded, or be in the disk cache. Warming up runs the model once outside any capture,
so each kiln kernel it calls is tuned (or read from the tuning database), compiled (or read
from the binary store) and loaded for its row bucket; optionally for other batch sizes or row
counts too, which a capture of another shape will ask for.
"""

import dataclasses
import time
from typing import Any, Dict, Iterable, List, Optional

import torch

from . import _C


@dataclasses.dataclass
class WarmupReport:
    """What :func:`warmup` did: kernels newly ready in this process (each a dict: device, op,
    problem, rows_bucket, config, ...), NVRTC compiles and their time, binaries read from the
    disk cache, tunes run and tuning results read, the batch sizes and row counts covered, and
    the wall time."""

    kernels: List[Dict[str, Any]]
    compiled: int
    compile_ms: float
    loaded_from_cache: int
    tuned: int
    tuning_hits: int
    batch_sizes: List[int]
    rows: List[int]
    seconds: float

    def __str__(self) -> str:
        return (f"kiln.warmup: {len(self.kernels)} kernels ready ({self.compiled} compiled in "
                f"{self.compile_ms / 1e3:.2f} s, {self.loaded_from_cache} from the cache, "
                f"{self.tuned} tuned, {self.tuning_hits} tuning results reused) in "
                f"{self.seconds:.2f} s")


def _kernel_key(kernel: Dict[str, Any]):
    return kernel["device"], kernel["problem"], kernel["rows_bucket"]


def _batch_of(args, kwargs) -> Optional[int]:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return value.shape[0]
    return None


def _resized(value, batch: int, size: int):
    """A tensor whose leading dimension is the batch, at `size` rows: cut, or repeated
    cyclically (real values, e.g. valid token ids). Anything else is passed as is."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != batch:
        return value
    if size <= batch:
        return value[:size]
    index = torch.arange(size, device=value.device) % batch
    return value.index_select(0, index)


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def warmup(model, *inputs, batch_sizes: Optional[Iterable[int]] = None,
           rows: Optional[Iterable[int]] = None, **kwargs) -> WarmupReport:
    """Runs ``model(*inputs, **kwargs)`` once under ``torch.no_grad()`` so every kiln kernel it
    calls is tuned, compiled and loaded now, not inside a later CUDA graph capture.

    ``batch_sizes``: also run it at these batch sizes (every tensor argument whose leading
    dimension equals the first tensor argument's is cut or cyclically repeated to each
    size), so a capture at those sizes finds its kernels' row buckets ready. ``rows``: also
    ready, for every kernel loaded in this process, the row buckets of these row counts
    (``rows`` being the op's rows: the input's elements over its last dimension), launching
    nothing. Must not be called while a graph is being captured. Returns a
    :class:`WarmupReport`."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("kiln.warmup: called while a CUDA graph is being captured; "
                           "call it before the capture begins")
    start = time.perf_counter()
    before_stats = _C.stats()
    before = {_kernel_key(k) for k in _C.loaded_kernels()}
    sizes = [int(b) for b in (batch_sizes or ())]
    row_counts = [int(r) for r in (rows or ())]
    with torch.no_grad():
        model(*inputs, **kwargs)
        batch = _batch_of(inputs, kwargs)
        if sizes and batch is None:
            raise ValueError("kiln.warmup: batch_sizes: expected a tensor input with a leading "
                             "(batch) dimension to resize, got none")
        for size in sizes:
            if size <= 0:
                raise ValueError(f"kiln.warmup: batch_sizes: expected sizes > 0, got {size}")
            model(*[_resized(a, batch, size) for a in inputs],
                  **{k: _resized(v, batch, size) for k, v in kwargs.items()})
    _sync()
    if row_counts:
        if any(r <= 0 for r in row_counts):
            raise ValueError(f"kiln.warmup: rows: expected counts > 0, got {row_counts}")
        _C.warm_rows([], row_counts)
    after_stats = _C.stats()
    kernels = [k for k in _C.loaded_kernels() if _kernel_key(k) not in before]
    kernels.sort(key=lambda k: (k["device"], k["problem"], k["rows_bucket"]))

    def delta(name):
        return after_stats[name] - before_stats[name]

    return WarmupReport(kernels=kernels, compiled=delta("nvrtc_compiles"),
                        compile_ms=delta("compile_ms"), loaded_from_cache=delta("binary_hits"),
                        tuned=delta("tunes"), tuning_hits=delta("tuning_hits"), batch_sizes=sizes,
                        rows=row_counts, seconds=time.perf_counter() - start)

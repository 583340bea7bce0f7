"""LTX-Video's rotary embedding, replaced: the same ``(cos, sin)`` tables, carrying the video
grid they come from so that kiln's attention processor computes the angles in its kernel.

In eager calls the tables themselves are deferred: built (by diffusers' own forward) only
when something reads them. kiln's processor reads the grid alone, so in a patched model the
two fp32 tables, each twice the size of q at LTX-Video's widths, are never built: at 161
frames that was ~0.5 ms of kernels and 265 MB of memory per forward, and a dozen host calls
in the part of the forward the GPU waits on.
"""

from collections.abc import Sequence
from numbers import Real
from typing import Callable, Optional

import torch

from .forwards import any_hooks, argument_binder


class VideoRotaryEmbedding(tuple):
    """``(cos, sin)`` as diffusers' ``LTXVideoRotaryPosEmbed`` returns them, plus their grid.
    Anything else sees the plain pair; a copy made from the pair alone (accelerate rebuilds
    tuples as ``type(t)(items)`` when it moves them) has no grid, and its tables are read."""

    def __new__(cls, pair, grid=None, scale=None, base_sizes=None, patch_sizes=None, theta=None):
        self = super().__new__(cls, pair)
        self.grid, self.scale, self.base_sizes = grid, scale, base_sizes
        self.patch_sizes, self.theta = patch_sizes, theta
        return self


class DeferredVideoRotaryEmbedding(Sequence):
    """The pair as a sequence whose tables are built on first read (indexing, unpacking,
    iteration: diffusers' ``apply_rotary_emb`` unpacks it), once, by the original forward.
    It is not a tuple, so C code that would read a tuple's items directly (``torch.cat``)
    raises instead of reading something else."""

    def __init__(self, build: Callable[[], tuple], grid, scale, base_sizes, patch_sizes, theta):
        self._build, self._pair = build, None
        self.grid, self.scale, self.base_sizes = grid, scale, base_sizes
        self.patch_sizes, self.theta = patch_sizes, theta

    def tables(self) -> tuple:
        if self._pair is None:
            self._pair = tuple(self._build())
            self._build = None
        return self._pair

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index):
        return self.tables()[index]

    def __iter__(self):
        return iter(self.tables())

    def __repr__(self) -> str:
        state = "built" if self._pair is not None else "not built"
        return f"DeferredVideoRotaryEmbedding(grid={self.grid}, tables {state})"


def _plain_scale(scale) -> Optional[tuple]:
    """The interpolation scale as three floats, or None where it is not three numbers."""
    if scale is None or len(scale) != 3:
        return None
    values = []
    for v in scale:
        if isinstance(v, torch.Tensor) and v.numel() == 1 and v.device.type == "cpu":
            v = v.item()
        if not isinstance(v, Real):
            return None
        values.append(float(v))
    return tuple(values)


def video_rope(module: torch.nn.Module, original: Callable) -> Callable:
    """``LTXVideoRotaryPosEmbed``: the original tables, with their grid; deferred in eager
    calls whose output no hook sees. Under torch.compile the tuple is traced as it is, and
    Inductor drops the tables where nothing reads them."""
    bind = argument_binder(original)

    def forward(*args, **kwargs):
        a = bind(args, kwargs)
        if a is None:
            return original(*args, **kwargs)
        frames, height, width = a.get("num_frames"), a.get("height"), a.get("width")
        if a.get("video_coords") is not None or not all(isinstance(n, int) for n in (frames, height, width)):
            return original(*args, **kwargs)
        scale = a.get("rope_interpolation_scale")
        plain = _plain_scale(scale)
        if scale is not None and plain is None:
            return original(*args, **kwargs)
        fields = ((frames, height, width), plain, (module.base_num_frames, module.base_height, module.base_width),
                  (module.patch_size_t, module.patch_size), float(module.theta))
        # A hook sees the tuple, as diffusers returns it (diffusers' context parallelism
        # splits the tables in one).
        if torch.compiler.is_compiling() or any_hooks(module):
            return VideoRotaryEmbedding(original(*args, **kwargs), *fields)
        return DeferredVideoRotaryEmbedding(lambda: original(*args, **kwargs), *fields)

    return forward

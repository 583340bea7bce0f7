"""kiln: a JIT kernel compiler and autotuner for the memory-bound operators of LLMs and
diffusion transformers.

Ops are registered with the torch dispatcher as ``torch.ops.kiln.*``; the functions here
are thin wrappers. The first CUDA call of a new (device, op, dtype, hidden size) compiles
the kernel with NVRTC and tunes it; later calls, and later processes, hit the caches.
``import kiln`` works on a machine with no GPU (NVRTC and the driver load on first use).
"""

import torch  # noqa: F401  (loads libtorch, which the extension links against)

from . import _library_paths
from . import _C
from . import _fakes  # noqa: F401  (registers the fake implementations)
from . import _fakes_norm  # noqa: F401
from . import _fakes_activation  # noqa: F401
from ._api import compile, configure, device_count, device_info, settings, stats
from ._api import (cache_clear, cache_export, cache_import, cache_ls, cache_stats, cache_trim,
                   cache_verify, prewarm)
from ._api import report, tune_export, tune_import, tune_pin, tune_unpin
from .ops import rms_norm
from .norm_ops import (ada_values, adaln, fused_add_rms_norm, fused_add_rms_norm_, gated_adaln, layer_norm,
                       rms_norm_gated)
from .activation_ops import clamped_swiglu, gated_residual, gated_residual_, geglu, gelu, swiglu
from . import _fakes_rope  # noqa: F401  (registers the RoPE fakes)
from .rope_ops import head_norm_rope, head_norm_rope_, rms_norm_rope, rope, rope_, rope_3d
from .patching import PatchReport, patch, unpatch
from .warmup import WarmupReport, warmup
from . import hub  # noqa: F401  (kiln's layers for the `kernels` package's kernelize)
from . import _fakes_norm_backward  # noqa: F401  (registers the norm backward fakes)
from . import _fakes_pointwise_backward  # noqa: F401  (fakes of the backward ops)

_library_paths.register(_C)

from . import _inductor  # noqa: E402

_inductor.install()  # kiln's ops as explicit Inductor fallbacks (see _inductor.py)

__version__ = "0.1.0"

__all__ = [
    "ada_values",
    "adaln",
    "cache_clear",
    "cache_export",
    "cache_import",
    "cache_ls",
    "cache_stats",
    "cache_trim",
    "cache_verify",
    "compile",
    "configure",
    "device_count",
    "device_info",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "gated_adaln",
    "layer_norm",
    "patch",
    "PatchReport",
    "prewarm",
    "report",
    "tune_export",
    "tune_import",
    "tune_pin",
    "tune_unpin",
    "rms_norm",
    "rms_norm_gated",
    "swiglu",
    "clamped_swiglu",
    "geglu",
    "gelu",
    "gated_residual",
    "gated_residual_",
    "head_norm_rope",
    "head_norm_rope_",
    "rms_norm_rope",
    "rope",
    "rope_",
    "rope_3d",
    "settings",
    "stats",
    "unpatch",
    "warmup",
    "WarmupReport",
]

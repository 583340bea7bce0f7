"""How the Python spellings reach an op. In eager code, through ``kiln._C.direct``: typed
arguments and the same dispatcher path as ``torch.ops.kiln.*`` (autograd, autocast, modes,
the CUDA or CPU kernel) without its boxed call, about 1 us less host time per call. Dynamo
cannot trace into those C++ functions and reads ``compiling()`` as True, so under
torch.compile the spellings trace ``torch.ops.kiln.*`` instead."""

import torch

from ._C import direct

compiling = torch.compiler.is_dynamo_compiling

__all__ = ["direct", "compiling"]

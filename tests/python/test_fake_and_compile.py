"""The fake implementation: torch.compile(fullgraph=True) traces kiln's op, and opcheck
passes on the CPU path."""

import torch

import kiln
from reference import assert_close_to, rms_norm_fp64


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 64, dtype=torch.bfloat16)
        w = torch.empty(64, dtype=torch.bfloat16)
        out = torch.ops.kiln.rms_norm(x, w, 1e-6)
        assert out.shape == (2, 5, 64) and out.dtype == torch.bfloat16 and out.is_contiguous()


def test_compile_fullgraph_cpu():
    def block(x, w):
        return kiln.rms_norm(x * 2, w) + 1

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x, w = torch.randn(3, 32), torch.randn(32)
    assert_close_to(compiled(x, w), rms_norm_fp64(x * 2, w, 1e-6) + 1, torch.float32)


def test_opcheck_cpu():
    for w in (torch.randn(16), None):
        torch.library.opcheck(torch.ops.kiln.rms_norm.default, (torch.randn(4, 16), w, 1e-6),
                              test_utils=("test_schema", "test_faketensor"))

"""The CPU implementation (kiln's registered reference) against fp64 math."""

import pytest
import torch

import kiln
from reference import assert_close_to, rms_norm_fp64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 768, 1023, 4096])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("with_weight", [True, False])
def test_cpu_matches_fp64(dtype, hidden, rows, with_weight):
    x = torch.randn(rows, hidden, dtype=dtype) * 3
    w = (torch.randn(hidden) + 1).to(dtype) if with_weight else None
    out = torch.ops.kiln.rms_norm(x, w, 1e-5)
    assert out.dtype == dtype and out.is_contiguous()
    assert_close_to(out, rms_norm_fp64(x, w, 1e-5), dtype)


def test_leading_shapes_and_non_contiguous_inputs():
    base = torch.randn(4, 6, 64)
    x = base.transpose(0, 1)  # rows do not collapse into one stride
    w = torch.randn(64)
    out = kiln.rms_norm(x, w)
    assert out.shape == x.shape
    assert_close_to(out, rms_norm_fp64(x, w, 1e-6), torch.float32)
    sliced = torch.randn(5, 128)[:, :64]  # row stride 128 > hidden
    assert_close_to(kiln.rms_norm(sliced, w), rms_norm_fp64(sliced, w, 1e-6), torch.float32)


def test_zero_rows_give_an_empty_result():
    out = kiln.rms_norm(torch.randn(0, 3, 16), torch.randn(16))
    assert out.shape == (0, 3, 16)

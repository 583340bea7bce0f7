"""kiln.patch on tiny SD3 and SD3.5 Medium transformers on a GPU in bf16: as close to the fp32
model as diffusers' own bf16 forward, with the calls test_patch_sd3_cpu.py counts (but GELU's: on
CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_sd3_cpu import CALLS, MODELS, _sd3, _sd3_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_sd3_tiny_bf16_cuda(monkeypatch, name):
    with torch.no_grad():
        truth = _sd3(torch.float32, "cuda", **MODELS[name])(**_sd3_inputs(torch.float32, "cuda"))[0]
        model = _sd3(torch.bfloat16, "cuda", **MODELS[name])
        inputs = _sd3_inputs(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        kiln.patch(model)
        counter = Counter(monkeypatch)
        patched = model(**inputs)[0]
        used = counter.used()
        assert {op: n for op, n in used.items() if op != "gelu"} == {
            op: n for op, n in CALLS[name].items() if op != "gelu"}
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)

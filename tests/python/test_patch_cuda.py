"""kiln.patch on tiny random transformers models on a GPU: bf16 patched vs unpatched, and
the patched model under torch.compile(fullgraph=True)."""

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from test_patch_cpu import ARCHS, MLP_OP, _Counter, _ids, _model  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_cuda_patched_is_as_close_to_fp32_as_the_original(arch, monkeypatch):
    ids = _ids().cuda()
    with torch.no_grad():
        truth = _model(arch, torch.float32).cuda()(ids).logits.double()
        model = _model(arch, torch.bfloat16).cuda()
        original = model(ids).logits
        report = kiln.patch(model)
        assert {r.op for r in report.replaced} == {"rms_norm", MLP_OP[arch], "rope"} and report.left == []
        counter = _Counter(monkeypatch)  # after the patch, whose probes call the ops too
        patched = model(ids).logits
    # q and k reach kiln.rope as the attention makes them: transposed views of the projections.
    assert counter.calls["rope"] == 2 and counter.calls[MLP_OP[arch]] == 2
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-2, (err_patched, err_original)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_patched_model_compiles_fullgraph(arch):
    torch._dynamo.reset()
    ids = _ids().cuda()
    model = _model(arch, torch.bfloat16).cuda()
    kiln.patch(model)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-2)

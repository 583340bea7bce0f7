"""kiln.patch on diffusion transformers on a GPU in bf16: the patched model must be as close
to the fp32 model as the unpatched bf16 one is (kiln rounds each fused seam once, diffusers
after every op, so the patched error is expected at or below the original's), for tiny
LTX-Video and FLUX transformers and one default-size LTX-Video block."""

import copy

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.transformers.transformer_ltx import (  # noqa: E402
    LTXVideoRotaryPosEmbed, LTXVideoTransformerBlock)

from test_patch_diffusers_cpu import _ltx, _ltx_inputs, _ltx_out  # noqa: E402
from test_patch_dit_cpu import (COGVIDEOX_CALLS, FLUX_FUSED, LTX_FUSED, Counter, _cogvideox,  # noqa: E402
                                _cogvideox_inputs, _flux, _flux_inputs, _flux_out)


def _on_cuda(fused, after_projection=None):
    """What the patched forward calls on a GPU: the tanh GELU after a projection (each of
    them, or `after_projection` of them) runs in the projection's cuBLASLt epilogue there
    (kiln.gelu on the CPU); FLUX's single blocks still call kiln.gelu, writing proj_out's input."""
    expected = dict(fused)
    moved = expected["gelu"] if after_projection is None else after_projection
    expected["gemm gelu epilogue"] = moved
    expected["gelu"] -= moved
    return {k: v for k, v in expected.items() if v}


def _count_epilogues(counter, monkeypatch):
    real = torch._addmm_activation
    counter.calls["gemm gelu epilogue"] = 0

    def counted(*args, **kwargs):
        counter.calls["gemm gelu epilogue"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_addmm_activation", counted)
    return counter


def _as_close_as_the_original(patched, original, truth):
    err_original = (original.double() - truth.double()).abs().max().item()
    err_patched = (patched.double() - truth.double()).abs().max().item()
    assert patched.dtype == original.dtype == torch.bfloat16
    assert err_patched <= 1.5 * err_original + 1e-2 * truth.double().abs().max().item(), (err_patched, err_original)


def assert_tiny_bf16_model(build, inputs, calls, monkeypatch, more=()):
    """A tiny model on the GPU (``build(dtype, device)``, ``inputs(dtype, device)``): patched in
    bf16 it is as close to the fp32 model as diffusers' own bf16 forward and makes ``calls`` (but
    GELU's: on CUDA the tanh GELU after a projection joins its epilogue; ``more``: Counter's other
    wrappers to count); unpatched, it computes what it did."""
    with torch.no_grad():
        truth = build(torch.float32, "cuda")(**inputs(torch.float32, "cuda"))[0]
        model = build(torch.bfloat16, "cuda")
        bf16_inputs = inputs(torch.bfloat16, "cuda")
        original = model(**bf16_inputs)[0]
        kiln.patch(model)
        counter = Counter(monkeypatch, more)
        patched = model(**bf16_inputs)[0]
        used = {op: n for op, n in counter.used().items() if op != "gelu"}
        assert used == {op: n for op, n in calls.items() if op != "gelu"}
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**bf16_inputs)[0], original)


@pytest.mark.gpu
def test_ltx_tiny_bf16_cuda(monkeypatch):
    truth = _ltx_out(_ltx(torch.float32, "cuda"), _ltx_inputs(torch.float32, "cuda"))
    model = _ltx(torch.bfloat16, "cuda")
    inputs = _ltx_inputs(torch.bfloat16, "cuda")
    original = _ltx_out(model, inputs)
    report = kiln.patch(model)
    assert report.left == []
    counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
    patched = _ltx_out(model, inputs)
    assert counter.used() == _on_cuda(LTX_FUSED)
    _as_close_as_the_original(patched, original, truth)
    kiln.unpatch(model)
    assert torch.equal(_ltx_out(model, inputs), original)


@pytest.mark.gpu
def test_flux_tiny_bf16_cuda(monkeypatch):
    truth = _flux_out(_flux(torch.float32, "cuda"), _flux_inputs(torch.float32, "cuda"))
    model = _flux(torch.bfloat16, "cuda")
    inputs = _flux_inputs(torch.bfloat16, "cuda")
    original = _flux_out(model, inputs)
    report = kiln.patch(model)
    assert report.left == []
    counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
    patched = _flux_out(model, inputs)
    assert counter.used() == _on_cuda(FLUX_FUSED, after_projection=2)
    _as_close_as_the_original(patched, original, truth)
    kiln.unpatch(model)
    assert torch.equal(_flux_out(model, inputs), original)


@pytest.mark.gpu
def test_cogvideox_tiny_bf16_cuda(monkeypatch):
    """CogVideoX's modulated LayerNorms (weight and bias) as kiln.adaln on the GPU: as close to
    the fp32 model as diffusers' own bf16 forward."""
    with torch.no_grad():
        truth = _cogvideox(torch.float32, "cuda")(**_cogvideox_inputs(torch.float32, "cuda"))[0]
        model = _cogvideox(torch.bfloat16, "cuda")
        inputs = _cogvideox_inputs(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        report = kiln.patch(model)
        assert report.left == []
        counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
        patched = model(**inputs)[0]
        assert counter.used() == _on_cuda(COGVIDEOX_CALLS)
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)


@pytest.mark.gpu
def test_ltx_default_size_block_bf16_cuda(monkeypatch):
    """LTX-Video's default block (2048 wide, 32 heads of 64, cross-attention 2048) on a
    4 x 16 x 24 latent grid, its angles computed in the kernel from the grid."""
    torch.manual_seed(0)
    dim, frames, height, width = 2048, 4, 16, 24
    block = LTXVideoTransformerBlock(dim, 32, 64, cross_attention_dim=2048).eval().cuda()
    rope = LTXVideoRotaryPosEmbed(dim)
    g = torch.Generator(device="cuda").manual_seed(1)
    s = frames * height * width
    h = torch.randn(1, s, dim, device="cuda", generator=g)
    enc = torch.randn(1, 128, dim, device="cuda", generator=g)
    temb = torch.randn(1, 1, 6 * dim, device="cuda", generator=g)
    mask = torch.zeros(1, 1, 128, device="cuda")
    mask[..., 100:] = -10000.0
    scale = (0.32, 32.0, 32.0)

    def run(module, dtype, rope_module):
        table = rope_module(h, frames, height, width, scale)
        with torch.no_grad():
            return module(h.to(dtype), enc.to(dtype), temb.to(dtype), table, mask.to(dtype))

    truth = run(block, torch.float32, rope)
    block = copy.deepcopy(block).to(torch.bfloat16)
    original = run(block, torch.bfloat16, rope)
    assert len(kiln.patch(block).replaced) == 10 and len(kiln.patch(rope).replaced) == 1
    counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
    patched = run(block, torch.bfloat16, rope)
    assert counter.calls["rms_norm_rope grid"] == 1 and counter.calls["gated_adaln"] == 1
    assert counter.calls["gemm gelu epilogue"] == 1 and counter.calls["gelu"] == 0
    _as_close_as_the_original(patched, original, truth)
    monkeypatch.undo()
    torch._dynamo.reset()
    compiled = run(torch.compile(block, fullgraph=True), torch.bfloat16, rope)
    _as_close_as_the_original(compiled, original, truth)
    kiln.unpatch(block)
    kiln.unpatch(rope)
    assert torch.equal(run(block, torch.bfloat16, rope), original)


@pytest.mark.gpu
def test_ltx_first_called_inside_a_cuda_graph_capture():
    """The patched block keeps its constant operands (gated_adaln's zero gate and ones row)
    between calls; one made during a capture is only recorded there, not filled, so it must
    not be kept. A model patched afresh and first called inside a capture gives the eager
    result in an eager call right after the capture and in the replay."""
    model = _ltx(torch.bfloat16, "cuda")
    inputs = _ltx_inputs(torch.bfloat16, "cuda")
    kiln.patch(model)
    expected = _ltx_out(model, inputs)  # builds kiln's kernels: none may build in a capture
    kiln.unpatch(model)
    kiln.patch(model)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = model(**inputs)[0]
    assert torch.equal(_ltx_out(model, inputs), expected)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
    kiln.unpatch(model)


@pytest.mark.gpu
def test_ltx_a_mask_kept_between_calls_is_not_read_by_a_capture():
    """The patched attention keeps the last prepared cross-attention mask for the next block.
    A 3-D mask bias is passed on as it is (the transformer converts only 2-D masks), so one
    tensor can reach an eager call and then a capture. The capture must make its own
    prepared mask: the kept one is freed when a later call replaces it, and the replay would
    read whatever took its memory."""
    model = _ltx(torch.bfloat16, "cuda")
    inputs = _ltx_inputs(torch.bfloat16, "cuda")
    bias = torch.zeros(2, 1, 5, device="cuda", dtype=torch.bfloat16)
    bias[1, :, 3:] = -10000.0
    inputs["encoder_attention_mask"] = bias
    kiln.patch(model)
    expected = _ltx_out(model, inputs)  # keeps the prepared mask of `bias`
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = model(**inputs)[0]
    _ltx_out(model, dict(inputs, encoder_attention_mask=torch.zeros_like(bias)))  # replaces it
    poison = [torch.full((256,), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(256)]
    graph.replay()
    torch.cuda.synchronize()
    del poison
    assert torch.equal(captured, expected)
    kiln.unpatch(model)

"""kiln.patch on Wan transformers on a GPU in bf16: the patched model must be as close to the
fp32 model as the unpatched bf16 one is (a tiny model, and one default-size Wan 2.1 1.3B block
with its fp32 rotary and modulation tables), in eager calls, under torch.compile and replayed
from a CUDA graph."""

import copy

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock  # noqa: E402

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_wan_cpu import LAYERS, _wan, _wan_inputs, _wan_out  # noqa: E402


@pytest.mark.gpu
def test_wan_tiny_bf16_cuda(monkeypatch):
    truth = _wan_out(_wan(torch.float32, "cuda"), _wan_inputs(torch.float32, "cuda"))
    model = _wan(torch.bfloat16, "cuda")
    inputs = _wan_inputs(torch.bfloat16, "cuda")
    original = _wan_out(model, inputs)
    report = kiln.patch(model)
    assert report.left == []
    counter = Counter(monkeypatch)
    patched = _wan_out(model, inputs)
    assert counter.calls["rms_norm_rope"] == LAYERS and counter.calls["rope"] == 0
    # The seams with the fp32 modulation tables diffusers keeps (_wan keeps them in fp32).
    assert counter.calls["adaln"] == 1 and counter.calls["gated_adaln"] == 3 * LAYERS - 1
    _as_close_as_the_original(patched, original, truth)
    kiln.unpatch(model)
    assert torch.equal(_wan_out(model, inputs), original)


@pytest.mark.gpu
def test_wan_default_size_block_bf16_cuda(monkeypatch):
    """Wan 2.1 1.3B's block (1536 wide, 12 heads of 128, feed-forward 8960) on a 3 x 12 x 20
    latent grid, with the fp32 tables WanRotaryPosEmbed makes, as diffusers keeps them in a
    bf16 model: eager, compiled and replayed from a CUDA graph."""
    torch.manual_seed(0)
    dim, heads = 1536, 12
    block = WanTransformerBlock(dim, 8960, heads, cross_attn_norm=True, eps=1e-6).eval().cuda()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    rope = WanRotaryPosEmbed(dim // heads, (1, 2, 2), 1024).cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    latents = torch.zeros(1, 16, 3, 24, 40, device="cuda")
    s = 3 * 12 * 20
    h = torch.randn(1, s, dim, device="cuda", generator=g)
    enc = torch.randn(1, 512, dim, device="cuda", generator=g)
    temb = torch.randn(1, 6, dim, device="cuda", generator=g)
    table = rope(latents)
    assert table[0].dtype == torch.float32 and table[0].shape == (1, s, 1, dim // heads)

    def run(module, dtype):
        with torch.no_grad():
            return module(h.to(dtype), enc.to(dtype), temb.to(dtype), table)

    truth = run(block, torch.float32)
    block = copy.deepcopy(block).to(torch.bfloat16)
    # As diffusers' loader keeps them.
    for tensor in (block.scale_shift_table, block.norm2.weight, block.norm2.bias):
        tensor.data = tensor.data.float()
    original = run(block, torch.bfloat16)
    report = kiln.patch(block)
    assert {r.path: r.op for r in report.replaced}["attn1"] == "rms_norm_rope"
    counter = Counter(monkeypatch)
    patched = run(block, torch.bfloat16)
    assert counter.calls["rms_norm_rope"] == 1
    assert counter.calls["adaln"] == 1 and counter.calls["gated_adaln"] == 2
    _as_close_as_the_original(patched, original, truth)
    monkeypatch.undo()
    torch._dynamo.reset()
    compiled = run(torch.compile(block, fullgraph=True), torch.bfloat16)
    _as_close_as_the_original(compiled, original, truth)
    static_h = h.to(torch.bfloat16)
    with torch.no_grad():
        block(static_h, enc.to(torch.bfloat16), temb.to(torch.bfloat16), table)  # JIT and tables outside
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = block(static_h, enc.to(torch.bfloat16), temb.to(torch.bfloat16), table)
    graph.replay()
    torch.cuda.synchronize()
    _as_close_as_the_original(replayed, original, truth)
    kiln.unpatch(block)
    assert torch.equal(run(block, torch.bfloat16), original)

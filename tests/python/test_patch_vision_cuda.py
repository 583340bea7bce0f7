"""kiln.patch of transformers' vision towers on a GPU: the attentions' RoPE (kiln.rope of the
fp32 table, q and k strided views of one qkv projection, head dims 80 and 72 as Qwen2.5-VL's and
Qwen3-VL's), the two-layer GELU MLPs (the first projection's GELU epilogue without autograd,
kiln.gelu with it), bf16 against the fp32 truth, eager and compiled."""

import pytest
import torch

import kiln
from kiln import activation_ops, rope_ops

from vision_towers import embeddings, pixels, qwen2_5_vl, qwen3_vl, seeded
from test_patch_vision_cpu import _count, _images, _pooled, _siglip

# The released towers' head dims: Qwen2.5-VL 1280 / 16 = 80, Qwen3-VL 1152 / 16 = 72.
TOWERS = {"qwen2.5-vl": (qwen2_5_vl, dict(hidden=160, heads=2)), "qwen3-vl": (qwen3_vl, dict(hidden=144, heads=2))}


def _on_gpu(name, dtype):
    build, sizes = TOWERS[name]
    return seeded(build, dtype, **sizes).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TOWERS))
def test_bf16_tower_patched_is_as_close_to_fp32_as_the_original(name, monkeypatch):
    truth_tower = _on_gpu(name, torch.float32)
    values, grid = pixels(truth_tower)
    values, grid = values.cuda(), grid.cuda()
    truth = embeddings(truth_tower, values, grid).double()
    tower = _on_gpu(name, torch.bfloat16)
    original = embeddings(tower, values, grid)
    report = kiln.patch(tower)
    assert sum(r.op == "rope" for r in report.replaced) == 2
    ropes = _count(monkeypatch, rope_ops, "rope")
    gelus = _count(monkeypatch, activation_ops, "gelu")
    patched = embeddings(tower, values, grid)
    assert len(ropes) == 2
    q, k, cos, sin = ropes[0][0]
    assert q.is_cuda and q.dtype == torch.bfloat16 and cos.dtype == torch.float32 and not q.is_contiguous()
    # Qwen3-VL's tanh GELU runs in the first projection's epilogue: no kiln.gelu launch.
    assert gelus == []
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-3, (err_patched, err_original)
    kiln.unpatch(tower)
    assert torch.equal(embeddings(tower, values, grid), original)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TOWERS))
def test_compiled_patched_tower_matches_eager_patched(name):
    tower = _on_gpu(name, torch.bfloat16)
    values, grid = pixels(tower)
    values, grid = values.cuda(), grid.cuda()
    kiln.patch(tower)
    expected = embeddings(tower, values, grid)
    torch._dynamo.reset()
    for block in tower.blocks:
        block.compile(dynamic=False)
    actual = embeddings(tower, values, grid)
    torch._dynamo.reset()
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_bf16_siglip_patched_is_as_close_to_fp32_as_the_original():
    images = _images().cuda()
    truth = _pooled(_siglip(torch.float32).cuda(), images).double()
    model = _siglip(torch.bfloat16).cuda()
    original = _pooled(model, images)
    report = kiln.patch(model)
    assert sum(r.op == "gelu" for r in report.replaced) == 3
    patched = _pooled(model, images)
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-3, (err_patched, err_original)


@pytest.mark.gpu
def test_patched_siglip_trains_through_kiln_gelu(monkeypatch):
    """With autograd recording, the MLPs run kiln.gelu (the epilogue has no backward): the
    gradients match the unpatched model's in fp32."""
    plain, patched = _siglip().cuda(), _siglip().cuda()
    kiln.patch(patched)
    images = _images().cuda()
    gelus = _count(monkeypatch, activation_ops, "gelu")
    grads = []
    for model in (plain, patched):
        x = images.clone().requires_grad_()
        (model(pixel_values=x).pooler_output ** 2).sum().backward()
        grads.append((x.grad, model.encoder.layers[0].mlp.fc1.weight.grad))
    assert len(gelus) == 3
    for expected, actual in zip(*grads):
        torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)

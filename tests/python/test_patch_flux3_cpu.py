"""kiln.patch on a tiny FLUX.3 transformer (CPU): its attentions' fp32 per-head q/k norms and
rotation as one kiln.head_norm_rope of q and k (a kept weight of v's dtype where the loader
keeps the norms in fp32), with and without reference image tokens, in fp32 and bf16; under
autograd the norms as modules and one kiln.rope; unpatch restores diffusers' processors.

Tolerances as test_patch_dit_cpu.py's: kiln rounds the normalised heads once more than
diffusers (an ulp of bf16 at most)."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Flux3Transformer2DModel"):
    pytest.skip("this diffusers has no FLUX.3", allow_module_level=True)

from test_patch_dit_cpu import Counter, _agree, _processors  # noqa: E402

MODE_LAYERS, SINGLE_LAYERS = 2, 2


def _flux3(dtype, device="cpu"):
    """A tiny FLUX.3 transformer in ``dtype``, its q/k norms in fp32 as diffusers' loader keeps
    them (``_keep_in_fp32_modules``), their weights spread from 1."""
    torch.manual_seed(0)
    model = diffusers.Flux3Transformer2DModel(
        in_channels=8, cond_in_channels=8, num_layers=MODE_LAYERS, num_single_layers=SINGLE_LAYERS,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24, timestep_channels=16,
        axes_dims_rope=(4, 4, 4, 4)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model = model.to(device)
    for name, p in model.named_parameters():
        if not any(k in name.split(".") for k in model._keep_in_fp32_modules):
            p.data = p.data.to(dtype)
    return model


def _ids(rows, cols, t=0.0):
    """FLUX.3's (t, h, w, l) position ids of a rows x cols token grid."""
    grid = torch.stack(torch.meshgrid(torch.arange(float(rows)), torch.arange(float(cols)), indexing="ij"), -1)
    ids = torch.zeros(rows * cols, 4)
    ids[:, 0], ids[:, 1:3] = t, grid.reshape(-1, 2)
    return ids


def _flux3_inputs(dtype, device="cpu", reference=False):
    g = torch.Generator().manual_seed(3)
    text = 5
    inputs = dict(hidden_states=torch.randn(2, 12, 8, generator=g),
                  encoder_hidden_states=torch.randn(2, text, 24, generator=g), timestep=torch.tensor([0.3, 0.7]),
                  img_ids=_ids(3, 4), txt_ids=torch.zeros(text, 4))
    if reference:
        inputs.update(image_cond_hidden_states=torch.randn(2, 6, 8, generator=g), image_cond_ids=_ids(2, 3, t=1.0))
    inputs = {k: v.to(device, dtype) if k.endswith("states") or k == "timestep" else v.to(device)
              for k, v in inputs.items()}
    return dict(inputs, return_dict=False)


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _attentions(reference):
    """The attentions a forward runs: the text's and the image's mode blocks, the reference
    image's where it is given, the joint blocks."""
    return MODE_LAYERS * (3 if reference else 2) + SINGLE_LAYERS


@pytest.mark.parametrize("reference", [False, True], ids=["text-to-image", "with-reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flux3_attentions_fuse_norms_and_rotation(dtype, reference, monkeypatch):
    model = _flux3(dtype)
    inputs = _flux3_inputs(dtype, reference=reference)
    processors = _processors(model)
    expected = _out(model, inputs)
    report = kiln.patch(model)
    attentions = {r.path: r.kind for r in report.replaced if r.path.endswith(".attn")}
    assert len(attentions) == 3 * MODE_LAYERS + SINGLE_LAYERS
    assert set(attentions.values()) == {"flux.3 attention (per-head q/k rms_norm + rope)"}
    assert report.left == []
    counter = Counter(monkeypatch)
    actual = _out(model, inputs)
    assert counter.calls["head_norm_rope"] == _attentions(reference)
    assert counter.calls["rope"] == 0 and counter.calls["rms_norm"] == 0
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert _processors(model) == processors
    assert torch.equal(_out(model, inputs), expected)


def test_flux3_with_autograd_rotates_the_normalised_heads(monkeypatch):
    """Recording a graph (head_norm_rope has no backward): diffusers' fp32 norms, one kiln.rope."""
    model = _flux3(torch.float32)
    inputs = _flux3_inputs(torch.float32)
    expected = model(**inputs)[0]
    expected.pow(2).mean().backward()
    grad = model.single_transformer_blocks[0].attn.norm_q.weight.grad.clone()
    model.zero_grad()
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    actual.pow(2).mean().backward()
    assert counter.calls["head_norm_rope"] == 0 and counter.calls["rope"] == _attentions(False)
    _agree(actual.detach(), expected.detach(), torch.float32)
    torch.testing.assert_close(model.single_transformer_blocks[0].attn.norm_q.weight.grad, grad, rtol=1e-4, atol=1e-6)


def test_flux3_norm_weight_change_reaches_the_fused_call():
    """The fp32 norms' weights rounded to bf16 are kept between calls and made again after the
    weight changes (a LoRA fused into it, a new checkpoint)."""
    model = _flux3(torch.bfloat16)
    inputs = _flux3_inputs(torch.bfloat16)
    kiln.patch(model)
    _out(model, inputs)
    with torch.no_grad():
        model.txt_mode_blocks[0].attn.norm_k.weight.mul_(1.5)
    expected = _out(_unpatched_copy(model), inputs)
    _agree(_out(model, inputs), expected, torch.bfloat16)


def _unpatched_copy(model):
    import copy

    clone = copy.deepcopy(model)
    kiln.unpatch(clone)
    return clone

"""kiln.patch on tiny transformers built as copies of FLUX (CPU): Bria 3.x, Bria FIBO,
LongCat-Image and Ovis-Image. Their attention processors compute FLUX's attention under their
own class names, Bria's blocks name their attention's arguments ``attention_kwargs``, Bria FIBO's
single blocks take the joined stream, and Ovis-Image's single blocks gate their MLP with a SiLU:
each gets FLUX's patch (the attention's norms and rotation, the blocks' seams), fp32 and bf16
against diffusers' forward; unpatch restores the model."""

import inspect

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import Counter, _agree, _instance_forwards, _norms_spread, _processors  # noqa: E402

WIDTH, TEXT, IMAGE = 32, 5, 12


def _build(name: str, **config):
    torch.manual_seed(0)
    model = getattr(diffusers, name)(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2,
                                     attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                     axes_dims_rope=[4, 6, 6], **config).eval()
    return _norms_spread(model)


def _inputs(key: str, dtype, device="cpu"):
    """Two samples of a 3x4 image after 5 text tokens, with what each model's forward takes."""
    g = torch.Generator().manual_seed(3)
    name, config, _, _ = COPIES[key]
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1)
    data = dict(hidden_states=torch.randn(2, IMAGE, 8, generator=g),
                encoder_hidden_states=torch.randn(2, TEXT, 24, generator=g), timestep=torch.tensor([0.3, 0.7]))
    takes = inspect.signature(getattr(diffusers, name).forward).parameters
    if "pooled_projections" in takes and "pooled_projection_dim" in config:
        data["pooled_projections"] = torch.randn(2, config["pooled_projection_dim"], generator=g)
    inputs = {k: v.to(device, dtype) for k, v in data.items()}
    if "text_encoder_layers" in takes:
        inputs["text_encoder_layers"] = [torch.randn(2, TEXT, config["text_encoder_dim"], generator=g).to(device, dtype)
                                         for _ in range(3)]  # one a block: _build makes three
    return dict(inputs, img_ids=ids.reshape(IMAGE, 3).to(device), txt_ids=torch.zeros(TEXT, 3, device=device),
                return_dict=False)


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


# name: (diffusers' class, its config beyond FLUX's, its single blocks' MLP activation, kiln
# calls of its own: Ovis-Image's text embedding's RMSNorm)
COPIES = {
    "bria": ("BriaTransformer2DModel", {}, "gelu", {}),
    "bria_fibo": ("BriaFiboTransformer2DModel", {"text_encoder_dim": 16}, "gelu", {}),
    "longcat_image": ("LongCatImageTransformer2DModel", {"pooled_projection_dim": 12}, "gelu", {}),
    "ovis_image": ("OvisImageTransformer2DModel", {"out_channels": 8}, "swiglu", {"rms_norm": 1}),
}


def _copy(key: str, dtype, device="cpu"):
    name, config, _, _ = COPIES[key]
    if not hasattr(diffusers, name):
        pytest.skip(f"this diffusers has no {name}")
    return _build(name, **config).to(device, dtype)


# Without autograd, as FLUX's patch (test_patch_dit_cpu.FLUX_FUSED): AdaLN 2 + 2 + 1; the q/k
# norms and rotation one head_norm_rope a single block and one in place a stream in the double
# block; the double block's seams a stream each; each single block's activation written into
# proj_out's input and its gated residual. Ovis-Image's feed-forwards are SwiGLUs: the double
# block's two kiln.swiglu calls, and a single block's gated MLP one.
def _fused(act: str, own: dict) -> dict:
    return {"adaln": 5, "head_norm_rope": 2, "head_norm_rope_": 2, "gated_adaln": 2, "gated_residual_": 2,
            "gated_residual": 2, act: 4, **own}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("key", sorted(COPIES))
def test_flux_copy_gets_flux_patch(key, dtype, monkeypatch):
    _, _, act, own = COPIES[key]
    model = _copy(key, dtype)
    inputs = _inputs(key, dtype)
    processors = _processors(model)
    expected = _out(model, inputs)
    report = kiln.patch(model)
    assert report.left == []
    kinds = {r.path: r.kind for r in report.replaced}
    for path in ("transformer_blocks.0.attn", "single_transformer_blocks.0.attn", "single_transformer_blocks.1.attn"):
        assert kinds[path] == "flux attention (per-head q/k rms_norm + rope)"
    assert kinds["transformer_blocks.0"] == "flux double block (gated residual + norm seams)"
    assert kinds["single_transformer_blocks.1"] == f"flux single block ({act} into proj_out's input, gated residual)"
    counter = Counter(monkeypatch, more=[(activation_ops, "swiglu")])
    actual = _out(model, inputs)
    assert counter.used() == _fused(act, own)
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert _processors(model) == processors and _instance_forwards(model) == []
    assert torch.equal(_out(model, inputs), expected)


def test_bria_blocks_take_their_attention_kwargs_by_name():
    """Bria's transformer passes ``attention_kwargs=`` to its blocks: the patched blocks take it
    by that name, and an IP-adapter's arguments among them send the double block to diffusers'
    forward."""
    model = _copy("bria", torch.float32)
    kiln.patch(model)
    block = model.transformer_blocks[0]
    g = torch.Generator().manual_seed(5)
    h, c = torch.randn(2, IMAGE, WIDTH, generator=g), torch.randn(2, TEXT, WIDTH, generator=g)
    temb = torch.randn(2, WIDTH, generator=g)
    with torch.no_grad():
        patched = block(hidden_states=h, encoder_hidden_states=c, temb=temb, image_rotary_emb=None,
                        attention_kwargs={})
        kiln.unpatch(model)
        original = block(hidden_states=h, encoder_hidden_states=c, temb=temb, image_rotary_emb=None,
                         attention_kwargs={})
    for a, e in zip(patched, original):
        _agree(a, e, torch.float32)


def test_ovis_single_block_gated_mlp_runs_as_diffusers_where_the_activation_is_hooked(monkeypatch):
    """A hook on an Ovis-Image single block's SiLU may change what it computes: that block runs
    diffusers' forward (no swiglu of its own), the other stays on kiln, and the model agrees."""
    model = _copy("ovis_image", torch.float32)
    inputs = _inputs("ovis_image", torch.float32)
    expected = _out(model, inputs)
    kiln.patch(model)
    model.single_transformer_blocks[0].act_mlp.register_forward_hook(lambda *args: None)
    counter = Counter(monkeypatch, more=[(activation_ops, "swiglu")])
    _agree(_out(model, inputs), expected, torch.float32)
    assert counter.used()["swiglu"] == 3 and counter.used()["gated_residual"] == 1


def test_a_single_block_gated_the_other_way_round_is_left():
    """A FLUX-form single block whose SiLU gates the first half of proj_mlp's output by the
    second (Ovis-Image's gates the second by the first) does not compute what kiln's seam does:
    the probe leaves it."""
    model = _copy("ovis_image", torch.float32)
    block = model.single_transformer_blocks[0]

    def gate_first(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        text = encoder_hidden_states.shape[1]
        x = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        norm_x, gate = block.norm(x, emb=temb)
        act_in, up = block.proj_mlp(norm_x).chunk(2, dim=-1)
        attn = block.attn(hidden_states=norm_x, image_rotary_emb=image_rotary_emb)
        x = x + gate.unsqueeze(1) * block.proj_out(torch.cat([attn, block.act_mlp(act_in) * up], dim=2))
        return x[:, :text], x[:, text:]

    block.forward = gate_first
    report = kiln.patch(block)
    assert "" not in {r.path for r in report.replaced}
    [left] = [left for left in report.left if left.path == ""]
    assert "single-stream block" in left.reason and "fails on the probe" not in left.reason

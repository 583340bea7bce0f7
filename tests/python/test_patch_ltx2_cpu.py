"""kiln.patch on LTX-2's transformer (diffusers' LTX2VideoTransformer3DModel: video and audio
streams), on the CPU: its attentions' rotations as kiln.rope (split per head, as LTX-2's
checkpoints rotate, or interleaved, where self-attention's norms and rotation are one
kiln.rms_norm_rope), its blocks' seams as kiln.adaln, kiln.gated_adaln and
kiln.gated_residual_, against diffusers' own forward: fp32 and bf16, per-token timesteps,
LTX-2.3's gated attention and text modulation, isolated modalities, under autograd and under
torch.compile."""

import functools

import pytest
import torch

import kiln
from kiln import rope_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_ltx2", reason="this diffusers has no LTX-2 transformer")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

BLOCK = "ltx2 block (adaln, gated residual + norm seams, two streams)"
SPLIT = "ltx2 attention (split rope of q and k)"
INTERLEAVED = "ltx2 attention (q/k rms_norm + interleaved rope)"
ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
# LTX-2.3's transformer: per-head attention gates, the text attention's query, keys and values
# modulated, perturbed attention processors (spatio-temporal guidance), text embeddings taken at
# the attentions' widths (no caption projection: the audio stream's are 8 wide here).
LTX23 = dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
             perturbed_attn=True, use_prompt_embeddings=False)
LTX23_INPUTS = dict(audio_text=8)

FRAMES, HEIGHT, WIDTH, AUDIO_FRAMES = 2, 3, 4, 5


def _ltx2(dtype, device="cpu", **config):
    """A tiny LTX-2 transformer (two blocks; LTX-2's split rotation unless ``config`` says
    otherwise), its norms' weights spread."""
    torch.manual_seed(0)
    settings = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                    audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
                    audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_type="split")
    settings.update(config)
    model = diffusers.LTX2VideoTransformer3DModel(**settings).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _ltx2_inputs(dtype, device="cpu", per_token=False, audio_text=16, **extra):
    """Two samples of a 2 x 3 x 4 latent video, 5 audio latents and 7 text tokens a stream, as
    LTX2Pipeline calls the transformer (``per_token``: a timestep per video token, as its
    conditioned frames get; ``audio_text``: the audio stream's text embeddings' width)."""
    g = torch.Generator().manual_seed(3)
    video_tokens = FRAMES * HEIGHT * WIDTH
    timestep = 1000 * torch.rand(2, video_tokens if per_token else 1, generator=g)
    given = dict(hidden_states=torch.randn(2, video_tokens, 4, generator=g),
                 audio_hidden_states=torch.randn(2, AUDIO_FRAMES, 4, generator=g),
                 encoder_hidden_states=torch.randn(2, 7, 16, generator=g),
                 audio_encoder_hidden_states=torch.randn(2, 7, audio_text, generator=g),
                 timestep=timestep.squeeze(1) if not per_token else timestep,
                 audio_timestep=1000 * torch.rand(2, generator=g), sigma=torch.rand(2, generator=g))
    given = {k: v.to(device=device, dtype=dtype) for k, v in given.items()}
    given.update(num_frames=FRAMES, height=HEIGHT, width=WIDTH, audio_num_frames=AUDIO_FRAMES, return_dict=False)
    given.update(extra)
    return given


def _both(outputs):
    return torch.cat([o.flatten() for o in outputs])


# A block each: per stream one adaln (norm1) and one for the second audio-video modulation, three
# gated_adaln (norm2, the audio-video norm, norm3: each after a residual), one gated_residual_
# (the feed-forward's); q/k norms of its six attentions, a rotation of q and k together for each
# self-attention and of each apart for the two audio-video attentions; the feed-forwards' GELUs.
# The model's two output LayerNorms.
LTX2_CALLS = {"adaln": 8, "gated_adaln": 12, "gated_residual_": 4, "rope": 12, "rms_norm": 24, "gelu": 4,
              "layer_norm": 2}


def _patched_agrees(model, inputs, dtype, monkeypatch, attention=SPLIT) -> dict:
    with torch.no_grad():
        expected = model(**inputs)
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert report.left == []
        for i in range(2):
            assert kinds[f"transformer_blocks.{i}"] == BLOCK
            for name in ATTENTIONS:
                assert kinds[f"transformer_blocks.{i}.{name}"] in (attention, SPLIT, INTERLEAVED)
        counter = Counter(monkeypatch)
        actual = model(**inputs)
        _agree(_both(actual), _both(expected), dtype)
        return counter.used()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ltx2_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _ltx2(dtype)
    inputs = _ltx2_inputs(dtype)
    assert _patched_agrees(model, inputs, dtype, monkeypatch) == LTX2_CALLS
    with torch.no_grad():
        expected = _both(kiln.unpatch(model) and model(**inputs))
    assert _instance_forwards(model) == []
    kiln.patch(model)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(_both(model(**inputs)), expected)


def test_ltx2_per_token_timesteps(monkeypatch):
    """A timestep per video token (LTX2Pipeline's conditioned frames): the modulation is read per token."""
    used = _patched_agrees(_ltx2(torch.float32), _ltx2_inputs(torch.float32, per_token=True), torch.float32,
                           monkeypatch)
    assert used == LTX2_CALLS


def test_ltx2_3_gated_attention_and_text_modulation(monkeypatch):
    """LTX-2.3: per-head attention gates, nine modulation rows (the text query's three) and the
    text keys' and values' modulation from the prompt's sigma, or from the tables alone."""
    for prompt_adaln in (True, False):
        model = _ltx2(torch.float32, use_prompt_adaln_single=prompt_adaln, **LTX23)
        inputs = _ltx2_inputs(torch.float32, **LTX23_INPUTS)
        assert _patched_agrees(model, inputs, torch.float32, monkeypatch) == LTX2_CALLS


@pytest.mark.parametrize("guided", [[1], [0, 1]])
def test_ltx2_3_spatio_temporal_guidance(monkeypatch, guided):
    """LTX-2.3's perturbed attention: the second sample's self-attentions in block 1 replaced by
    their values; with no mask every sample's in both blocks, whose rotations are then skipped."""
    mask = dict(perturbation_mask=torch.tensor([1.0, 0.0])) if len(guided) == 1 else {}
    inputs = _ltx2_inputs(torch.float32, spatio_temporal_guidance_blocks=guided, **mask, **LTX23_INPUTS)
    used = _patched_agrees(_ltx2(torch.float32, **LTX23), inputs, torch.float32, monkeypatch)
    assert used == (LTX2_CALLS if mask else dict(LTX2_CALLS, rope=8, rms_norm=16))


def test_ltx2_isolated_modalities_skip_the_audio_video_seams(monkeypatch):
    """Without the audio-video cross-attentions (LTX-2.3's modality guidance) each stream's text
    residual goes straight into norm3's seam."""
    used = _patched_agrees(_ltx2(torch.float32), _ltx2_inputs(torch.float32, isolate_modalities=True), torch.float32,
                           monkeypatch)
    assert used == dict(LTX2_CALLS, adaln=4, gated_adaln=8, rope=4, rms_norm=16)


def test_ltx2_interleaved_self_attention_is_one_rms_norm_rope(monkeypatch):
    """diffusers' default rotation (adjacent pairs across the row, as LTX-Video's): each
    self-attention's norms and rotation in one kiln.rms_norm_rope."""
    model = _ltx2(torch.float32, rope_type="interleaved")
    used = _patched_agrees(model, _ltx2_inputs(torch.float32), torch.float32, monkeypatch, INTERLEAVED)
    assert used == dict(LTX2_CALLS, rms_norm_rope=4, rope=8, rms_norm=16)


def test_ltx2_trains_through_kiln_rope_and_diffusers_seams(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward)
    and the attentions their norm modules and kiln.rope; every gradient agrees."""
    used = _trains_as_diffusers(_ltx2(torch.float32), _ltx2_inputs(torch.float32), lambda: Counter(monkeypatch))
    assert used["rope"] == 12 and "gated_adaln" not in used and "adaln" not in used


def test_ltx2_block_is_left_to_inductor_under_torch_compile():
    """Compiled, a patched block runs diffusers' seams (Inductor fuses them with their
    neighbours); its attentions still rotate in kiln's launches."""
    graphs = _compiled_patched_graphs(_ltx2(torch.float32), _ltx2_inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.gated_adaln.default) == []
    assert len(calls_of(graphs, torch.ops.kiln.rope.default)) == 12


def test_ltx2_attention_with_another_rotation_is_left():
    """A processor that rotates otherwise keeps diffusers' processor; the others are kiln's."""
    from diffusers.models.transformers import transformer_ltx2 as lt

    model = _ltx2(torch.float32)
    block = model.transformer_blocks[0]

    class Swapped(type(block.attn1.processor)):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     query_rotary_emb=None, key_rotary_emb=None):
            if query_rotary_emb is not None:
                query_rotary_emb = (query_rotary_emb[0], -query_rotary_emb[1])
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                    key_rotary_emb)

    Swapped.__call__.__qualname__ = lt.LTX2AudioVideoAttnProcessor.__call__.__qualname__
    Swapped.__module__ = lt.__name__
    block.attn1.set_processor(Swapped())
    report = kiln.patch(model)
    left = {entry.path: entry.reason for entry in report.left}
    assert "LTX-2's attention" in left["transformer_blocks.0.attn1"]
    assert {r.path: r.kind for r in report.replaced}["transformer_blocks.1.attn1"] == SPLIT


def test_ltx2_block_with_another_formula_is_left():
    """A block whose feed-forward residual is not gated as LTX-2's keeps diffusers' forward."""
    model = _ltx2(torch.float32)
    block = model.transformer_blocks[0]
    forward = type(block).forward

    @functools.wraps(forward)
    def ungated(self, *args, **kwargs):
        video, audio = forward(self, *args, **kwargs)
        return 2 * video, audio

    block.forward = ungated.__get__(block)
    report = kiln.patch(model)
    left = {entry.path: entry.reason for entry in report.left}
    assert "LTX-2's block seams" in left["transformer_blocks.0"]
    assert {r.path: r.kind for r in report.replaced}["transformer_blocks.1"] == BLOCK


def test_rope_of_q_alone_with_a_partner_of_no_heads():
    """kiln.rope with a k of no heads rotates q alone (the audio-video attentions' queries and
    keys, each with its own table): against the fp64 half-split formula."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 7 * 3, 8, generator=g)
    angles = 30 * torch.randn(2, 7 * 3, 4, generator=g, dtype=torch.float64)
    cos, sin = angles.cos(), angles.sin()
    rotated, none = rope_ops.rope(q, q[..., :0], cos.float(), sin.float(), rotary_dim=8, layout="bshd", head_dim=8)
    x = q.double()
    first, second = x[..., :4], x[..., 4:]
    expected = torch.cat([first * cos - second * sin, second * cos + first * sin], -1)
    assert none.shape == (2, 21, 0)
    torch.testing.assert_close(rotated.double(), expected, rtol=1e-5, atol=1e-5)

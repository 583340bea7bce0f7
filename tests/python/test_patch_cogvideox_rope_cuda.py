"""kiln.patch on a tiny CogVideoX-5b-form transformer on a GPU in bf16: its rotation one
kiln.rope_ an attention, as close to the fp32 model as diffusers' own bf16 forward, and at 5b's
head count and head dim."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_cogvideox_rope_cpu import _cogvideox_5b, _counter, _rope_inputs  # noqa: E402
from test_patch_dit_cpu import _cogvideox  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402


@pytest.mark.gpu
def test_cogvideox_5b_tiny_bf16_cuda(monkeypatch):
    with torch.no_grad():
        truth = _cogvideox_5b(torch.float32, "cuda")(**_rope_inputs(torch.float32, "cuda"))[0]
        model = _cogvideox_5b(torch.bfloat16, "cuda")
        inputs = _rope_inputs(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        kiln.patch(model)
        counter = _counter(monkeypatch)
        patched = model(**inputs)[0]
        assert counter.used()["rope_"] == 2
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)


@pytest.mark.gpu
def test_cogvideox_5b_attention_at_its_head_count_bf16_cuda():
    """One attention of 5b's form (48 heads of 64, 226 text tokens) on 13 x 30 x 45 video tokens'
    worth of a smaller grid: the rotation of the video tokens in place agrees with diffusers'."""
    model = _cogvideox(torch.bfloat16, "cuda", use_rotary_positional_embeddings=True, num_attention_heads=48,
                       attention_head_dim=64, text_embed_dim=64, time_embed_dim=64)
    attn = model.transformer_blocks[0].attn1
    g = torch.Generator().manual_seed(6)
    video, text = 13 * 6 * 9, 226
    angles = 20 * torch.randn(video, 32, generator=g)
    args = dict(hidden_states=torch.randn(2, video, 3072, generator=g).cuda().bfloat16(),
                encoder_hidden_states=torch.randn(2, text, 3072, generator=g).cuda().bfloat16(),
                image_rotary_emb=(angles.cos().repeat_interleave(2, -1).cuda(),
                                  angles.sin().repeat_interleave(2, -1).cuda()))
    with torch.no_grad():
        expected = attn(**args)
        kiln.patch(model)
        actual = attn(**args)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)

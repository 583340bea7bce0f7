"""kiln.patch on Stable Diffusion 3's and 3.5's transformer (diffusers' SD3Transformer2DModel), on
the CPU: its joint blocks' seams as kiln.gated_adaln and kiln.gated_residual_ (SD3.5 Medium's
dual-attention blocks' first gated residual as kiln.gated_residual; the last block's text stream
ending at its norm), against diffusers' own forward (fp32 and bf16), under autograd and under
torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

BLOCK = "sd3 joint block (gated residual + norm seams)"
# SD3 (no q/k norms) and SD3.5 Medium (per-head RMSNorms, the first block with a second attention).
MODELS = {"sd3": dict(), "sd3.5-medium": dict(qk_norm="rms_norm", dual_attention_layers=(0,))}


def _sd3(dtype, device="cpu", **config):
    """A tiny SD3 transformer of three blocks (the last one's text stream ends at its norm), its
    norms' weights spread."""
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=3,
                                            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                            caption_projection_dim=32, pooled_projection_dim=12, pos_embed_max_size=16,
                                            **config).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _sd3_inputs(dtype, device="cpu"):
    """Two 8 x 8 latents (16 tokens) and prompts of 7 tokens."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 7, 24, generator=g).to(device, dtype),
                pooled_projections=torch.randn(2, 12, generator=g).to(device, dtype),
                timestep=torch.tensor([300, 700], device=device), return_dict=False)


# The blocks' AdaLN modules (norm1 and norm1_context each) and the output AdaLN; a gated_adaln and a
# gated_residual_ a stream (five streams), a GELU each.
SD3_CALLS = {"adaln": 7, "gated_adaln": 5, "gated_residual_": 5, "gelu": 5}
# SD3.5 Medium: the dual block's norm1 (SD35AdaLayerNormZeroX) is diffusers' module around kiln's
# LayerNorm; its first gated residual; the q/k RMSNorms of each joint attention's two streams and of
# the second attention.
SD35_CALLS = dict(SD3_CALLS, adaln=6, layer_norm=1, gated_residual=1, rms_norm=14)
CALLS = {"sd3": SD3_CALLS, "sd3.5-medium": SD35_CALLS}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sd3_patched_agrees_and_unpatch_restores(dtype, name, monkeypatch):
    model, inputs = _sd3(dtype, **MODELS[name]), _sd3_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == kinds["transformer_blocks.2"] == BLOCK
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == CALLS[name]
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_sd3_chunked_feed_forward_runs_diffusers_block(monkeypatch):
    """A block whose feed-forward is chunked (set_chunk_feed_forward) runs diffusers' forward."""
    model, inputs = _sd3(torch.float32), _sd3_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        for block in model.transformer_blocks:
            block.set_chunk_feed_forward(2, 0)
        counter = Counter(monkeypatch)
        _agree(model(**inputs)[0], expected, torch.float32)
        assert "gated_adaln" not in counter.used()


def test_sd3_trains_as_diffusers(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward);
    every gradient agrees."""
    used = _trains_as_diffusers(_sd3(torch.float32, **MODELS["sd3.5-medium"]), _sd3_inputs(torch.float32),
                                lambda: Counter(monkeypatch))
    assert "gated_adaln" not in used and "gated_residual" not in used


def test_sd3_under_torch_compile():
    """Compiled, the blocks' seams stay kiln's."""
    graphs = _compiled_patched_graphs(_sd3(torch.float32, **MODELS["sd3.5-medium"]), _sd3_inputs(torch.float32))
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 5

"""kiln.patch on Chroma's transformer (diffusers' ChromaTransformer2DModel), on the CPU: its pruned
AdaLN modules as kiln.adaln, its double blocks' seams as kiln.gated_adaln and kiln.gated_residual_,
its single blocks' activation and gated residual, against diffusers' own forward (fp32 and bf16,
with and without the prompt's padding mask), under autograd and under torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

DOUBLE = "chroma double block (gated residual + norm seams)"
SINGLE = "chroma single block (gelu into proj_out's input, gated residual)"


def _chroma(dtype, device="cpu"):
    """A tiny Chroma transformer: two double and two single blocks, its norms' weights spread."""
    torch.manual_seed(0)
    model = diffusers.ChromaTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 6, 6), approximator_num_channels=8, approximator_hidden_dim=32,
        approximator_layers=1).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _chroma_inputs(dtype, device="cpu", masked=False):
    """Two 3 x 4 latents (12 tokens) and prompts of 5 tokens; ``masked``: the second prompt's last
    two tokens padding, as Chroma's pipeline masks them (the image tokens all kept)."""
    g = torch.Generator().manual_seed(3)
    s, t = 12, 5
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1)
    inputs = dict(hidden_states=torch.randn(2, s, 8, generator=g).to(device, dtype),
                  encoder_hidden_states=torch.randn(2, t, 24, generator=g).to(device, dtype),
                  timestep=torch.tensor([0.3, 0.7]).to(device, dtype), img_ids=ids.reshape(s, 3).to(device),
                  txt_ids=torch.zeros(t, 3, device=device), return_dict=False)
    if masked:
        mask = torch.ones(2, t + s, dtype=torch.bool, device=device)
        mask[1, 3:t] = False
        inputs["attention_mask"] = mask
    return inputs


# Without autograd: the pruned AdaLN modules (norm1 and norm1_context of each double block, each
# single block's norm, the output norm); per double block one gated_adaln and one gated_residual_
# a stream; each feed-forward's GELU and each single block's (written into proj_out's input); each
# single block's gated residual; the per-head q/k norms and rotation (in place on each stream of
# the joint attentions); the approximator's RMSNorm.
CALLS = {"adaln": 7, "gated_adaln": 4, "gated_residual_": 4, "gated_residual": 2, "gelu": 6, "head_norm_rope": 2,
         "head_norm_rope_": 4, "rms_norm": 1}


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chroma_patched_agrees_and_unpatch_restores(dtype, masked, monkeypatch):
    model, inputs = _chroma(dtype), _chroma_inputs(dtype, masked=masked)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == DOUBLE
        assert kinds["single_transformer_blocks.0"] == kinds["single_transformer_blocks.1"] == SINGLE
        assert kinds["transformer_blocks.1.norm1"] == kinds["transformer_blocks.1.norm1_context"] \
            == "adaln (layer norm, pruned zero)"
        assert kinds["single_transformer_blocks.0.norm"] == "adaln (layer norm, pruned zero single)"
        assert kinds["norm_out"] == "adaln (layer norm, pruned continuous)"
        assert report.left == []
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_chroma_mask_reaches_the_attention():
    """The padding mask changes the output (so the patched blocks above are compared on it)."""
    model = _chroma(torch.float32)
    kiln.patch(model)
    with torch.no_grad():
        plain = model(**_chroma_inputs(torch.float32))[0]
        masked = model(**_chroma_inputs(torch.float32, masked=True))[0]
    assert torch.equal(plain[0], masked[0]) and not torch.allclose(plain[1], masked[1], atol=1e-3)


def test_chroma_mask_is_expanded_once_a_forward(monkeypatch):
    """The blocks of a forward share one expansion of the padding mask, made again for a mask
    changed in place, and the model still agrees with diffusers'."""
    from kiln.patching import chroma

    model, inputs = _chroma(torch.float32), _chroma_inputs(torch.float32, masked=True)
    made = []
    real = chroma._PAIRWISE.make
    monkeypatch.setattr(chroma._PAIRWISE, "make", lambda mask: made.append(1) or real(mask))
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        made.clear()  # the patch's probes
        _agree(model(**inputs)[0], expected, torch.float32)
        assert len(made) == 1  # four blocks, one expansion
        inputs["attention_mask"][0, 4] = False
        changed = model(**inputs)[0]
        assert len(made) == 2
        kiln.unpatch(model)
        _agree(changed, model(**inputs)[0], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chroma_pruned_adaln_reads_rows_in_place(dtype, monkeypatch):
    """Each pruned module on its own, called with the slices of one modulation tensor the model
    hands its blocks: one kiln.adaln, the returned gates the module's own; the continuous one casts
    an fp32 emb to x's dtype as diffusers' does."""
    from diffusers.models.transformers.transformer_chroma import (ChromaAdaLayerNormContinuousPruned,
                                                                  ChromaAdaLayerNormZeroPruned,
                                                                  ChromaAdaLayerNormZeroSinglePruned)

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, 32, generator=g) + 0.5).to(dtype)
    rows = torch.randn(3, 20, 32, generator=g).to(dtype)
    modules = [(ChromaAdaLayerNormZeroPruned(32), rows[:, 2:8]),
               (ChromaAdaLayerNormZeroSinglePruned(32), rows[:, 8:11]),
               (ChromaAdaLayerNormContinuousPruned(32, 32, elementwise_affine=False, eps=1e-6),
                rows[:, -2:].float())]
    for module, emb in modules:
        module = module.to(dtype)
        with torch.no_grad():
            expected = module(x, emb=emb)
            assert [r.kind for r in kiln.patch(module).replaced][0].startswith("adaln (layer norm, pruned")
            counter = Counter(monkeypatch)
            actual = module(x, emb=emb)
        assert counter.used() == {"adaln": 1}
        expected, actual = (expected, actual) if isinstance(expected, tuple) else ((expected,), (actual,))
        _agree(actual[0], expected[0], dtype)
        for e, a in zip(expected[1:], actual[1:]):
            assert torch.equal(a, e)


def test_chroma_blocks_run_diffusers_forward_where_kiln_would_differ(monkeypatch):
    """A hook on a double block's norm2 or on a single block's activation: those blocks run
    diffusers' forward, and the patched model still agrees."""
    model, inputs = _chroma(torch.float32), _chroma_inputs(torch.float32, masked=True)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        model.transformer_blocks[0].norm2.register_forward_hook(lambda *args: None)
        model.single_transformer_blocks[0].act_mlp.register_forward_hook(lambda *args: None)
        counter = Counter(monkeypatch)
        _agree(model(**inputs)[0], expected, torch.float32)
    used = counter.used()
    assert used["gated_adaln"] == 2 and used["gated_residual"] == 1


def test_chroma_trains_as_diffusers(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward),
    the pruned AdaLN modules kiln.adaln (it has one); every gradient agrees."""
    used = _trains_as_diffusers(_chroma(torch.float32), _chroma_inputs(torch.float32, masked=True),
                                lambda: Counter(monkeypatch))
    assert used["adaln"] == 7 and "gated_adaln" not in used and "gated_residual" not in used


def test_chroma_under_torch_compile():
    """Compiled, the double blocks' seams stay kiln's (the single blocks step aside, as FLUX's do)."""
    graphs = _compiled_patched_graphs(_chroma(torch.float32), _chroma_inputs(torch.float32, masked=True))
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 4
    assert len(calls_of(graphs, torch.ops.kiln.adaln.default)) == 7

"""kiln.patch on a tiny Qwen-Image 2.1 transformer (CPU): its feed-forwards'
``out(silu(gate_layer(x)) * proj(x))`` as one kiln.swiglu between the projections; its blocks'
modulated seams (adaln, gated_adaln, gated_residual_) from the scales and activated gates derived
once a forward, per sample or per token (causal_condition); its attention's q/k norms and complex
rotation as one kiln.head_norm_rope (the segments and the KV cache diffusers'); its text RMSNorm
kiln's; fp32 and bf16 against diffusers' forward, with autograd; unpatch restores it. Its output
norm is still diffusers'."""

import pytest
import torch

import kiln
from kiln.patching import qwen_image21

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "QwenImage21Transformer2DModel"):
    pytest.skip("this diffusers has no Qwen-Image 2.1", allow_module_level=True)

from graph_model import calls_of  # noqa: E402
from gated_mlp_checks import assert_feed_forwards_gate_once, assert_trains_as_diffusers  # noqa: E402
from test_patch_dit_cpu import Counter, _agree  # noqa: E402

LAYERS = 2
# Each block's three seams and its attention's norms and rotation; the text's RMSNorm; the output
# norm's LayerNorm (its scale-only modulation diffusers').
CALLS = {"adaln": LAYERS, "gated_adaln": LAYERS, "gated_residual_": LAYERS, "head_norm_rope": LAYERS, "rms_norm": 1,
         "layer_norm": 1}


def _qwen_image21(dtype, causal_condition=True):
    torch.manual_seed(0)
    model = diffusers.QwenImage21Transformer2DModel(
        patch_size=1, in_channels=8, out_channels=8, num_layers=LAYERS, attention_head_dim=16, num_attention_heads=2,
        context_in_dim=24, mlp_ratio=2, axes_dims_rope=(4, 6, 6), causal_condition=causal_condition).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(dtype)


def _inputs(dtype):
    """Two samples of a 4x6 latent grid (2x2 patches: 6 image tokens) after 7 text tokens, the
    second's text padded after 5."""
    g = torch.Generator().manual_seed(3)
    text, h, w = 7, 4, 6
    mask = torch.ones(2, text, dtype=torch.long)
    mask[1, 5:] = 0
    image_mask = torch.cat([torch.zeros(2, text, dtype=torch.bool), torch.ones(2, h * w // 4, dtype=torch.bool)], 1)
    return dict(hidden_states=torch.randn(2, h * w, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, text, 24, generator=g).to(dtype),
                timestep=torch.tensor([0.3, 0.7]).to(dtype), img_shapes=[[(1, h, w)]] * 2, img_mask=image_mask,
                encoder_hidden_states_mask=mask, return_dict=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_image21_feed_forwards_gate_in_one_kiln_call(dtype, monkeypatch):
    assert_feed_forwards_gate_once(_qwen_image21(dtype), _inputs(dtype),
                                   [f"transformer_blocks.{i}.img_mlp" for i in range(LAYERS)],
                                   "mlp swiglu (gate_layer, proj, out)", dtype, monkeypatch)


def test_qwen_image21_trains_through_the_kiln_swiglu():
    assert_trains_as_diffusers(_qwen_image21(torch.float32), _inputs(torch.float32),
                               lambda m: [b.img_mlp.gate_layer.weight for b in m.transformer_blocks])


@pytest.mark.parametrize("causal_condition", [True, False], ids=["per-token", "per-sample"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_image21_block_seams_and_attention(dtype, causal_condition, monkeypatch):
    """Each block's seams in three kiln calls, the modulation derived once a forward for all the
    blocks: per token where the text and condition tokens take the t = 0 row (causal_condition),
    else per sample; each attention's q/k norms and rotation in one."""
    model = _qwen_image21(dtype, causal_condition)
    inputs = _inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    assert all(kinds[f"transformer_blocks.{i}"] == "qwen-image 2.1 block (adaln, gated residual + norm seams)"
               and kinds[f"transformer_blocks.{i}.attn"] == "qwen-image 2.1 attention (per-head q/k rms_norm + rope)"
               for i in range(LAYERS))
    derived = []
    real = qwen_image21._derive
    monkeypatch.setattr(qwen_image21._DERIVED, "make", lambda *a: derived.append(a) or real(*a))
    counter = Counter(monkeypatch)
    with torch.no_grad():
        actual = model(**inputs)[0]
    assert counter.used() == CALLS
    assert len(derived) == 1 and (len(derived[0]) == 2) == causal_condition
    _agree(actual, expected, dtype)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], expected)


def test_qwen_image21_block_with_a_hooked_norm_runs_diffusers_forward(monkeypatch):
    model = _qwen_image21(torch.float32)
    inputs = _inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
    kiln.patch(model)
    model.transformer_blocks[0].img_norm2.register_forward_hook(lambda *args: None)
    counter = Counter(monkeypatch)
    with torch.no_grad():
        actual = model(**inputs)[0]
    assert counter.used()["adaln"] == counter.used()["gated_adaln"] == LAYERS - 1
    _agree(actual, expected, torch.float32)


def test_qwen_image21_blocks_train_as_diffusers():
    """Recording a graph, the blocks run diffusers' forward and the attentions the norm modules
    and kiln.rope: the modulation's and the projections' gradients agree."""
    assert_trains_as_diffusers(_qwen_image21(torch.float32), _inputs(torch.float32),
                               lambda m: [m.modulation[1].weight] + [b.attn.to_q.weight for b in m.transformer_blocks])


def test_qwen_image21_block_probe_tells_the_selected_row():
    """A block that selects the t = 0 row for the target image's tokens (the other way round)
    does not compute what kiln's seams do: the probe leaves it."""
    from diffusers.models.transformers import transformer_qwenimage21 as module

    block = _qwen_image21(torch.float32).transformer_blocks[0]
    original = type(block).forward

    def swapped(self, hidden_states, modulation, rotary_emb=None, attention_mask=None, target_token_mask=None,
                layer_cache=None, kv_cache_mode=None, cache_write_slice=None, segments=None, key_valid=None):
        mask = None if target_token_mask is None else ~target_token_mask
        return original(self, hidden_states, modulation, rotary_emb, attention_mask, mask, layer_cache,
                        kv_cache_mode, cache_write_slice, segments, key_valid)

    assert module.QwenImage21TransformerBlock.forward is original
    block.forward = swapped.__get__(block)
    report = kiln.patch(block)
    assert "" not in {r.path for r in report.replaced}
    [left] = [entry for entry in report.left if entry.path == ""]
    assert "Qwen-Image 2.1's block seams" in left.reason and "fails on the probe" not in left.reason


def test_qwen_image21_attention_with_the_prompts_kv_cache(monkeypatch):
    """The prompt's keys and values cached at the first step (kiln's rotation stored) and read at
    the next (only the target image's tokens computed): both steps agree with diffusers'."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    model = _qwen_image21(torch.float32)
    steps = [_inputs(torch.float32), dict(_inputs(torch.float32), timestep=torch.tensor([0.2, 0.4]))]

    def run():
        cache = QwenImage21KVCache(LAYERS)
        with torch.no_grad():
            return [model(**inputs, kv_cache=cache, kv_cache_mode=mode)[0]
                    for inputs, mode in zip(steps, ("extract", "cached"))]

    expected = run()
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = run()
    assert counter.used()["head_norm_rope"] == 2 * LAYERS
    for a, e in zip(actual, expected):
        _agree(a, e, torch.float32)


def test_qwen_image21_rotation_alone_without_rms_norm_in_ops(monkeypatch):
    model = _qwen_image21(torch.float32)
    inputs = _inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
    report = kiln.patch(model, ops=["rope"])
    assert {r.path: r.kind for r in report.replaced} == {
        f"transformer_blocks.{i}.attn": "qwen-image 2.1 attention (rope of q and k)" for i in range(LAYERS)}
    counter = Counter(monkeypatch)
    with torch.no_grad():
        _agree(model(**inputs)[0], expected, torch.float32)
    assert counter.used() == {"rope": LAYERS}


def test_qwen_image21_flex_processor_is_left_to_diffusers():
    """The model builds its block mask for processors of the flex class: kiln leaves them."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21FlexAttnProcessor

    model = _qwen_image21(torch.float32)
    model.set_attn_processor(QwenImage21FlexAttnProcessor())
    report = kiln.patch(model)
    assert not any(r.path.endswith(".attn") for r in report.replaced)
    assert all(type(b.attn.processor) is QwenImage21FlexAttnProcessor for b in model.transformer_blocks)


def test_qwen_image21_patched_model_compiles():
    """torch.compile traces the patched model in one graph a block and agrees with the eager model:
    its blocks' seams diffusers' (Inductor reads the per-token selection in the kernels it fuses),
    its attention's q/k preparation kiln's (Inductor generates no complex arithmetic)."""
    torch._dynamo.reset()
    model = _qwen_image21(torch.float32)
    inputs = _inputs(torch.float32)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        for block in model.transformer_blocks:
            block.compile(backend=backend, fullgraph=True)
        _agree(model(**inputs)[0], expected, torch.float32)
    torch._dynamo.reset()
    assert len(graphs) == 1  # the second block reuses the first's graph
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope.default)) == 1
    assert calls_of(graphs, torch.ops.kiln.adaln.default) == []

"""kiln.patch on a tiny FLUX.3 transformer (CPU): its attentions' fp32 per-head q/k norms and
rotation as one kiln.head_norm_rope of q and k (a kept weight of v's dtype where the loader
keeps the norms in fp32), with and without reference image tokens, in fp32 and bf16; under
autograd the norms as modules and one kiln.rope; unpatch restores diffusers' processors. Its
blocks' seams (kiln.adaln, the attention's output added in the feed-forward's output matmul,
kiln.gated_residual), its modulation heads and output norm projecting one row a sample of the
expanded timestep embeddings (the transformer's forward activating them one row a sample), under
autograd, torch.compile and LoRA adapters.

Tolerances as test_patch_dit_cpu.py's: kiln rounds the normalised heads once more than
diffusers (an ulp of bf16 at most)."""

import pytest
import torch

import kiln
from kiln.patching import flux3_model

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Flux3Transformer2DModel"):
    pytest.skip("this diffusers has no FLUX.3", allow_module_level=True)

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import Counter, _agree, _compiled_patched_graphs, _processors  # noqa: E402

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
    weights = _trained_weights(model)
    grads = [w.grad.clone() for w in weights]
    model.zero_grad()
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    actual.pow(2).mean().backward()
    assert counter.calls["head_norm_rope"] == 0 and counter.calls["rope"] == _attentions(False)
    # The blocks' seams run diffusers' forward; the modulation heads project one row a sample.
    assert counter.calls["adaln"] == 0 and counter.calls["gated_residual"] == 0
    _agree(actual.detach(), expected.detach(), torch.float32)
    for w, grad in zip(weights, grads):
        torch.testing.assert_close(w.grad, grad, rtol=1e-4, atol=1e-6)


def _trained_weights(model):
    """A q norm's weight, the image's and the text's modulation heads', the output norm's."""
    return [model.single_transformer_blocks[0].attn.norm_q.weight,
            model.early_stream_modulations["image"].linear.weight,
            model.single_stream_modulations["txt"].linear.weight, model.norm_out.linear.weight]


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


MODULATIONS = ("early_stream_modulations", "single_stream_modulations")
BLOCK_KINDS = {
    "mode": "flux.3 mode block (adaln, attention + feed-forward in one matmul, gated residual)",
    "joint": "flux.3 joint block (adaln, attention + feed-forward in one matmul, gated residual)",
    "modulation": "flux.3 modulation (one row a sample of an expanded embedding)",
    "output": "flux.3 output adaln (layer norm, one row a sample of an expanded embedding)",
}


def _projected_rows(model):
    """{module path: the rows a sample of each call} of the modulation heads' and the output
    norm's projections, recorded by forward pre-hooks."""
    rows = {}
    paths = [f"{kind}.{mode}.linear" for kind in MODULATIONS for mode in ("image", "image_cond", "txt")]
    for path in paths + ["norm_out.linear"]:
        model.get_submodule(path).register_forward_pre_hook(
            lambda m, args, path=path: rows.setdefault(path, []).append(args[0].shape[1]))
    return rows


def _block_paths(model):
    mode = [f"mode_blocks.{m}.{i}" for m in ("image", "image_cond") for i in range(MODE_LAYERS)] \
        + [f"txt_mode_blocks.{i}" for i in range(MODE_LAYERS)]
    return mode, [f"single_transformer_blocks.{i}" for i in range(SINGLE_LAYERS)]


@pytest.mark.parametrize("reference", [False, True], ids=["text-to-image", "with-reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flux3_blocks_fuse_their_seams_and_modulate_once_a_sample(dtype, reference, monkeypatch):
    model = _flux3(dtype)
    inputs = _flux3_inputs(dtype, reference=reference)
    expected = _out(model, inputs)
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    mode, joint = _block_paths(model)
    assert kinds[""] == flux3_model.KIND and report.left == []
    assert all(kinds[p] == BLOCK_KINDS["mode"] for p in mode) and all(kinds[p] == BLOCK_KINDS["joint"] for p in joint)
    assert all(kinds[f"{k}.{m}"] == BLOCK_KINDS["modulation"] for k in MODULATIONS for m in ("image", "image_cond",
                                                                                                "txt"))
    assert kinds["norm_out"] == BLOCK_KINDS["output"]
    rows = _projected_rows(model)
    counter = Counter(monkeypatch, more=[(torch, "addmm")])
    actual = _out(model, inputs)
    modes = 3 if reference else 2
    # A modulated norm a mode block, one a stream in each joint block, the output norm; a gated
    # residual a mode block and one a stream; the attention's output added in each feed-forward.
    assert counter.calls["adaln"] == MODE_LAYERS * modes + 2 * SINGLE_LAYERS + 1
    assert counter.calls["gated_residual"] == MODE_LAYERS * modes + 2 * SINGLE_LAYERS
    assert counter.calls["addmm"] == MODE_LAYERS * modes + SINGLE_LAYERS
    assert counter.calls["layer_norm"] == 0
    # Every projection of a timestep embedding takes one row a sample (the reference's heads run
    # only with a reference image).
    assert set(rows) == {p for p in rows if reference or "image_cond" not in p} and len(rows) == 5 + reference * 2
    assert all(r == [1] for r in rows.values())
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert torch.equal(_out(model, inputs), expected)


def test_flux3_feed_forward_with_a_hooked_output_projection_adds_after_it():
    """A hook on the feed-forward's output projection (an offloading hook, an adapter's) runs:
    the attention's output is then added after the projection, not in its matmul."""
    model = _flux3(torch.float32)
    inputs = _flux3_inputs(torch.float32)
    expected = _out(model, inputs)
    kiln.patch(model)
    calls = []
    for block in model.single_transformer_blocks:
        block.ff.linear_out.register_forward_hook(lambda m, args, out: calls.append(out.shape))
    _agree(_out(model, inputs), expected, torch.float32)
    assert len(calls) == SINGLE_LAYERS


def test_flux3_modulation_of_distinct_rows_projects_every_row():
    """A modulation head given rows of their own (not one expanded) projects each, as diffusers."""
    model = _flux3(torch.float32)
    head = model.single_stream_modulations["image"]
    temb = torch.randn(2, 7, head.linear.in_features)
    with torch.no_grad():
        expected = head(temb)
        kiln.patch(model)
        actual = head(temb)
        expanded = head(temb[:, :1].expand(2, 7, -1))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual, expected)
    assert expanded.stride(1) == 0
    torch.testing.assert_close(expanded, expected[:, :1].expand(2, 7, -1).clone(), rtol=1e-6, atol=1e-6)


def test_flux3_under_torch_compile_leaves_the_seams_to_inductor():
    """Compiled, the blocks' seams and the output norm run diffusers' formulas (Inductor fuses
    them), the attentions still normalise and rotate in kiln's launches, and the compiled model
    agrees with diffusers' (checked by _compiled_patched_graphs)."""
    graphs = _compiled_patched_graphs(_flux3(torch.float32), _flux3_inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.adaln.default) == []
    assert calls_of(graphs, torch.ops.kiln.gated_residual.default) == []
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope.default)) == _attentions(False)


def test_flux3_lora_scale_reaches_the_patched_forward():
    """The transformer's forward is kiln's copy inside diffusers' apply_lora_scale wrapper: a LoRA
    scale passed in attention_kwargs weighs the adapters (of the attentions, the feed-forwards
    and the modulation heads) as in diffusers' model."""
    pytest.importorskip("peft", reason="peft is not installed")
    from peft import LoraConfig

    def adapted(patch):
        model = _flux3(torch.float32)
        if patch:
            kiln.patch(model)
        torch.manual_seed(1)
        model.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=[
            "to_q", "to_k", "to_v", "to_out.0", "linear_in", "linear_out", "linear"]), "style")
        return model

    inputs = _flux3_inputs(torch.float32)
    reference, model = adapted(False), adapted(True)
    plain = _out(_flux3(torch.float32), inputs)
    for scale in (1.0, 0.5, 0.0):
        x = dict(inputs, attention_kwargs={"scale": scale})
        expected = _out(reference, x)
        _agree(_out(model, x), expected, torch.float32)
        assert ((expected - plain).abs().max() > 0.05 * plain.abs().max()) == (scale != 0.0)


def test_flux3_flow_map_modulates_once_a_sample():
    """A flow-map (step-distilled) FLUX.3 adds the embedding of the timestep each step jumps to
    before the expansion: the patched forward still projects one row a sample, as diffusers."""
    torch.manual_seed(0)
    model = diffusers.Flux3Transformer2DModel(
        in_channels=8, cond_in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, timestep_channels=16, axes_dims_rope=(4, 4, 4, 4),
        flow_map=True).eval()
    inputs = dict(_flux3_inputs(torch.float32), target_timestep=torch.tensor([0.1, 0.4]))
    expected = _out(model, inputs)
    assert kiln.patch(model).left == []
    rows = _projected_rows(model)
    _agree(_out(model, inputs), expected, torch.float32)
    assert rows and all(r == [1] for r in rows.values())

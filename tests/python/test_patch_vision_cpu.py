"""kiln.patch of transformers' vision towers, on the CPU: the attentions' RoPE
(``apply_rotary_pos_emb_vision`` resolved to kiln.rope) and the two-layer GELU MLPs
(``fc2(gelu(fc1(x)))`` with kiln.gelu); what is replaced, what is left and why, and that the
patched towers compute what the originals do."""

import json
import types

import pytest
import torch

import kiln
from kiln import activation_ops, rope_ops
from kiln.patching import gelu_mlp, vision_rope

from graph_model import calls_of, compile_capturing
from vision_towers import (embeddings, inkling2, minimax_m3_vl, other_tower_inputs, pixels, qwen2_5_vl, qwen3_vl,
                           seeded)  # skips where transformers is missing
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
from transformers import SiglipVisionConfig, SiglipVisionModel, CLIPVisionConfig, CLIPVisionModel


def _count(monkeypatch, module, name):
    """The calls of ``module.name`` from here on, as (args, kwargs)."""
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append((a, kw)) or original(*a, **kw))
    return calls


def _tables(positions, dim, dtype=torch.float32, seed=3):
    angles = torch.rand(positions, dim // 2, generator=torch.Generator().manual_seed(seed)) * 20.0
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _reference(q, k, cos, sin):
    """The towers' formula in fp64, rounded once to q's dtype."""
    def rotate(x):
        x = x.double()
        c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * c + turned * s).to(q.dtype)
    return rotate(q), rotate(k)


# --- the attentions' RoPE -------------------------------------------------------------------------

@pytest.mark.parametrize("build", [qwen2_5_vl, qwen3_vl])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tower_rope_reaches_kiln(build, dtype, monkeypatch):
    """Each attention of Qwen2.5-VL's and Qwen3-VL's towers rotates its q and k (strided views of
    one qkv projection, [patches, heads, D]) with one kiln.rope of the fp32 table; the tower's
    merged embeddings stay what they were (fp32: to rounding; bf16: as close to the fp32 truth)."""
    tower = seeded(build, dtype)
    values, grid = pixels(tower)
    expected = embeddings(tower, values, grid)
    truth = embeddings(seeded(build), values, grid)
    report = kiln.patch(tower)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert [r.path for r in ropes] == ["blocks.0.attn", "blocks.1.attn"]
    assert all("apply_rotary_pos_emb_vision" in r.kind for r in ropes)
    calls = _count(monkeypatch, rope_ops, "rope")
    actual = embeddings(tower, values, grid)
    assert len(calls) == 2
    for (q, k, cos, sin), kwargs in calls:
        assert q.shape == (1, 48, 2, 32) and not q.is_contiguous() and cos.dtype == torch.float32
        assert kwargs == {"layout": "bshd"}
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        assert (actual.float() - truth).abs().max() <= 1.5 * (expected.float() - truth).abs().max() + 1e-3
    assert kiln.unpatch(tower) == len(report.replaced)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table_dtype", ["fp32", "q's"])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("dim", [8, 80])
def test_replacement_matches_the_formula(dtype, table_dtype, rank, dim, monkeypatch):
    """The replacement against the formula in fp64, rounded once: q and k as views of a packed
    projection ([S, H, D]) or batched ([B, S, H, D]), tables in fp32 or q's dtype, an even head
    dim of 8 or 80 (Qwen2.5-VL's), odd positions."""
    g = torch.Generator().manual_seed(0)
    positions, heads = 7, 3
    if rank == 3:
        q, k, _ = torch.randn(positions, 3, heads, dim, generator=g).to(dtype).permute(1, 0, 2, 3).unbind(0)
    else:
        q, k = (torch.randn(2, positions, heads, dim, generator=g).to(dtype) for _ in range(2))
    cos, sin = _tables(positions, dim, torch.float32 if table_dtype == "fp32" else dtype)
    calls = _count(monkeypatch, rope_ops, "rope")
    q_out, k_out = vision_rope.vision_rope(apply_rotary_pos_emb_vision)(q, k, cos, sin)
    assert len(calls) == 1
    formula = apply_rotary_pos_emb_vision(q, k, cos, sin)
    for actual, like, ref, original in zip((q_out, k_out), (q, k), _reference(q, k, cos, sin), formula):
        assert actual.dtype == dtype and actual.shape == like.shape
        tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
        torch.testing.assert_close(actual.double(), ref.double(), rtol=tol, atol=tol)
        torch.testing.assert_close(actual.double(), original.double(), rtol=2 * tol, atol=2 * tol)


def _other_calls():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    cos, sin = _tables(5, 8)
    half_cos, half_sin = _tables(5, 4)
    return {
        "a narrower table": ((q, k, half_cos[:, :4], half_sin[:, :4]), {}),
        "a table of other positions": ((q[:4], k[:4], cos, sin), {}),
        "a five-dimensional q": ((q[None, None], k[None, None], cos, sin), {}),
        "a table of a third dtype": ((q.bfloat16(), k.bfloat16(), cos.half(), sin.half()), {}),
        "k of another dtype": ((q, k.double(), cos, sin), {}),
        "a keyword": ((q, k, cos), {"sin": sin}),
    }


@pytest.mark.parametrize("case", list(_other_calls()))
def test_calls_kiln_does_not_compute_run_the_original(case, monkeypatch):
    args, kwargs = _other_calls()[case]
    seen = []

    def original(*a, **kw):
        seen.append(True)
        return "original"

    calls = _count(monkeypatch, rope_ops, "rope")
    assert vision_rope.vision_rope(original)(*args, **kwargs) == "original"
    assert seen == [True] and calls == []


def _four_dimensional_rotation(q, k, cos, sin):
    """MiniMax-M3-VL's rotation in transformers 5.17: the first cos.shape[-1] columns rotated in
    q's own dtype, its table broadcast for [B, S, H, D] q only (a three-dimensional q comes out
    four-dimensional)."""
    rot = cos.shape[-1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]

    def turn(x):
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        turned = torch.cat((-x_rot[..., rot // 2:], x_rot[..., :rot // 2]), dim=-1)
        return torch.cat([x_rot * cos + turned * sin, x_pass], dim=-1)

    return turn(q), turn(k)


def _inverse_rotation(q, k, cos, sin):
    """A rotation by the negative angles: no form kiln.rope computes."""
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)

    def turn(x):
        half = x.shape[-1] // 2
        return x * c - torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s

    return turn(q), turn(k)


def _four_dimensional_forward(self, x, cos, sin):
    q = self.q_proj(x).unflatten(-1, (2, 8))
    k = self.k_proj(x).unflatten(-1, (2, 8))
    return apply_rotary_pos_emb_vision(q, k, cos, sin)


def _attention_calling(rotation):
    """An attention class whose forward's global apply_rotary_pos_emb_vision is ``rotation``, as
    in its own module; x [B, S, 16] -> q, k [B, S, 2, 8]."""
    forward = types.FunctionType(_four_dimensional_forward.__code__,
                                 {**globals(), "apply_rotary_pos_emb_vision": rotation}, "forward")

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    return type("VisionAttention", (torch.nn.Module,), {"forward": forward, "__init__": __init__})


def test_another_vision_rotation_is_left_with_the_reason():
    report = kiln.patch(_attention_calling(_inverse_rotation)())
    assert report.replaced == []
    assert len(report.left) == 1
    reason = report.left[0].reason
    assert "its apply_rotary_pos_emb_vision is not replaced: it is neither rotate_half nor interleaved RoPE" in reason


def test_a_rotation_of_four_dimensional_q_only_is_taken_for_those(monkeypatch):
    """transformers 5.17's MiniMax-M3-VL rotation (four-dimensional q only, the first columns, in
    q's dtype): the attention's calls go to kiln.rope; a three-dimensional call keeps the original."""
    torch.manual_seed(0)
    attention = _attention_calling(_four_dimensional_rotation)().eval()
    x = torch.randn(2, 5, 16)
    cos, sin = _tables(5, 6)
    with torch.no_grad():
        expected = attention(x, cos, sin)
        report = kiln.patch(attention)
        assert [r.op for r in report.replaced] == ["rope"]
        assert "the first cos.shape[-1] columns of each head, q of 4 dimensions only" in report.replaced[0].kind
        calls = _count(monkeypatch, rope_ops, "rope")
        actual = attention(x, cos, sin)
    assert len(calls) == 1 and calls[0][1] == {"layout": "bshd", "rotary_dim": 6}
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    q, k = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    replacement = vision_rope.vision_rope(_four_dimensional_rotation, vision_rope.compare(_four_dimensional_rotation)[0])
    calls.clear()
    with pytest.raises(RuntimeError, match="same number of dimensions"):  # the original's own error
        replacement(q, k, cos, sin)
    assert calls == []


class _Block(torch.nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x, cos, sin):
        q, k = self.attention(x, cos, sin)
        return q + k


def test_a_patched_attention_inlined_into_a_compiled_block_keeps_its_graph():
    """The block, not the attention, is compiled (as models are compiled by block): Dynamo
    inlines the attention's kiln copy and guards on what its rotation reads through the
    copy's globals, which it finds again by their module's name. Named as the original's
    module, the guards read the original rotation and fail to build."""
    torch.manual_seed(0)
    block = _Block(_attention_calling(_four_dimensional_rotation)()).eval()
    x = torch.randn(2, 5, 16)
    cos, sin = _tables(5, 6)
    with torch.no_grad():
        expected = block(x, cos, sin)
        kiln.patch(block)
        compiled, graphs = compile_capturing(block)
        try:
            with torch._dynamo.config.patch(error_on_recompile=True):
                actual = compiled(x, cos, sin)
                again = compiled(x, cos, sin)
        finally:
            torch._dynamo.reset()
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.rope.default)) == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, actual, rtol=0, atol=0)


def _vision_function(module_name):
    module = pytest.importorskip(f"transformers.models.{module_name}.modeling_{module_name}")
    return module.apply_rotary_pos_emb_vision


@pytest.mark.parametrize("module_name, form", [
    ("qwen2_5_vl", vision_rope.VisionForm(interleaved=False, partial=False, fp32_table=True)),
    ("minimax_m3_vl", vision_rope.VisionForm(interleaved=False, partial=True, fp32_table=False)),
    ("inkling2", vision_rope.VisionForm(interleaved=True, partial=False, fp32_table=True)),
])
def test_vision_rotation_forms_are_told_apart(module_name, form):
    """Qwen's rotate_half in fp32; MiniMax-M3-VL's rotate_half of the first cos.shape[-1]
    columns in q's dtype (an fp32 table promotes its output, so only tables of q's dtype are
    taken); Inkling 2's interleaved pairs."""
    found, text = vision_rope.compare(_vision_function(module_name))
    # transformers 5.17's MiniMax-M3-VL broadcasts its table for q of 4 dimensions only.
    assert found is not None and found.ranks in ((3, 4), (4,)), text
    assert found._replace(ranks=form.ranks) == form, text
    assert ("q of 4 dimensions only" in text) == (found.ranks == (4,))
    assert ("interleaved pairs" in text) == form.interleaved
    assert ("the first cos.shape[-1] columns" in text) == form.partial


def _reference_of(form, q, k, cos, sin):
    """The form's formula in fp64 over the table's first columns, rounded once to q's dtype."""
    def turn(x):
        x, r = x.double(), cos.shape[-1]
        c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
        x_rot = x[..., :r]
        if form.interleaved:
            pairs = x_rot.unflatten(-1, (-1, 2))
            turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        else:
            turned = torch.cat((-x_rot[..., r // 2:], x_rot[..., :r // 2]), dim=-1)
        return torch.cat((x_rot * c + turned * s, x[..., r:]), dim=-1).to(q.dtype)
    return turn(q), turn(k)


@pytest.mark.parametrize("module_name, rotated", [("minimax_m3_vl", 78), ("minimax_m3_vl", 80), ("inkling2", 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [3, 4])
def test_other_vision_forms_match_their_formula(module_name, rotated, dtype, rank, monkeypatch):
    """The forms kiln.rope takes for MiniMax-M3-VL (78 of 80 columns, as its tower makes them, and
    all 80) and Inkling 2, tables of q's dtype, against the formula in fp64 and the function."""
    function = _vision_function(module_name)
    form, _ = vision_rope.compare(function)
    if rank not in form.ranks:
        pytest.skip(f"this transformers' {module_name} rotation takes q of {form.ranks} dimensions")
    g = torch.Generator().manual_seed(4)
    positions, heads = 7, 3
    if rank == 3:
        q, k, _ = torch.randn(positions, 3, heads, 80, generator=g).to(dtype).permute(1, 0, 2, 3).unbind(0)
    else:
        q, k = (torch.randn(2, positions, heads, 80, generator=g).to(dtype) for _ in range(2))
    angles = torch.rand(positions, rotated, generator=g) * 20.0
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    calls = _count(monkeypatch, rope_ops, "rope")
    actual = vision_rope.vision_rope(function, form)(q, k, cos, sin)
    assert len(calls) == 1
    assert calls[0][1] == {"layout": "bshd", **({"interleaved": True} if form.interleaved else {}),
                           **({"rotary_dim": rotated} if rotated != 80 else {})}
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3}[dtype]
    for a, like, ref, original in zip(actual, (q, k), _reference_of(form, q, k, cos, sin), function(q, k, cos, sin)):
        assert a.dtype == dtype and a.shape == like.shape
        torch.testing.assert_close(a.double(), ref.double(), rtol=tol, atol=tol)
        torch.testing.assert_close(a.double(), original.double(), rtol=2 * tol, atol=2 * tol)


def test_a_form_of_q_dtype_tables_leaves_an_fp32_table_to_the_original(monkeypatch):
    """MiniMax-M3-VL's rotation of bf16 q by an fp32 table gives fp32 (promoted): left to it."""
    function = _vision_function("minimax_m3_vl")
    form, _ = vision_rope.compare(function)
    q, k = torch.randn(1, 5, 2, 8).bfloat16(), torch.randn(1, 5, 2, 8).bfloat16()
    cos, sin = _tables(5, 8)
    calls = _count(monkeypatch, rope_ops, "rope")
    q_out, _ = vision_rope.vision_rope(function, form)(q, k, cos, sin)
    assert calls == [] and q_out.dtype == torch.float32


@pytest.mark.parametrize("build", [minimax_m3_vl, inkling2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_towers_rope_reaches_kiln(build, dtype, monkeypatch):
    """MiniMax-M3-VL's and Inkling 2's towers: each attention's rotation is one kiln.rope (the
    partial rotate_half, the interleaved pairs); the towers' outputs stay what they were (fp32:
    to rounding; bf16: as close to the fp32 truth)."""
    if build() is None:
        pytest.skip(f"this transformers has no {build.__name__}")
    tower = seeded(build, dtype)
    inputs = other_tower_inputs(tower)
    truth_tower = seeded(build)
    with torch.no_grad():
        expected = tower(**inputs).last_hidden_state
        truth = truth_tower(**{k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}).last_hidden_state
        report = kiln.patch(tower)
        ropes = [r for r in report.replaced if r.op == "rope"]
        assert len(ropes) == 2 and all("apply_rotary_pos_emb_vision" in r.kind for r in ropes)
        calls = _count(monkeypatch, rope_ops, "rope")
        actual = tower(**inputs).last_hidden_state
    assert len(calls) == 2
    (q, _, cos, _), options = calls[0]
    assert options.get("interleaved", False) == (build is inkling2)
    # MiniMax-M3-VL's tower rotates the first 78 of its heads' 80 columns (three axes of 26;
    # transformers 5.17's rotated all 80 by two axes): kiln rotates as many as the table is wide.
    head, width = q.shape[-1], cos.shape[-1]
    assert (head, width) in ([(80, 78), (80, 80)] if build is minimax_m3_vl else [(head, head)])
    assert options.get("rotary_dim") == (None if width == head else width)
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        assert (actual.float() - truth).abs().max() <= 1.5 * (expected.float() - truth).abs().max() + 1e-3
    assert kiln.unpatch(tower) == len(report.replaced)


@pytest.mark.parametrize("build", [minimax_m3_vl, inkling2])
def test_towers_compiled_by_block_run_kiln_rope(build):
    """Each block compiled on its own, as models are compiled by block: the patched attention,
    inlined into its block's graph, calls kiln.rope there, and the other block and a second
    forward reuse the graphs. Dynamo finds an inlined function's globals again by their module's name, so the
    attention's kiln copy must not name the original's module: its guards would then read
    the original rotation, not kiln's (transformers 5.17's MiniMax-M3-VL failed so)."""
    if build() is None:
        pytest.skip(f"this transformers has no {build.__name__}")
    tower = seeded(build)
    inputs = other_tower_inputs(tower)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        expected = tower(**inputs).last_hidden_state
        kiln.patch(tower)
        torch._dynamo.reset()
        for layer in tower.layers:
            layer.compile(backend=backend)
        try:
            with torch._dynamo.config.patch(error_on_recompile=True):
                actual = tower(**inputs).last_hidden_state
                again = tower(**inputs).last_hidden_state
        finally:
            torch._dynamo.reset()
    # The blocks share their code and so their graphs (later transformers break them at the
    # attention's sequence lengths): the rotation is in one.
    assert len(calls_of(graphs, torch.ops.kiln.rope.default)) == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, actual, rtol=0, atol=0)


class _QwenVisionAttention(torch.nn.Module):
    """Qwen2.5-VL's rotation as its attention calls it: q, k and v views of one packed projection."""

    def __init__(self, hidden=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x, cos, sin):
        q, k, v = self.qkv(x).reshape(x.shape[0], 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
        return q * k + v


def test_compiled_vision_attention_has_kiln_rope_in_one_graph():
    torch.manual_seed(0)
    attention = _QwenVisionAttention().eval()
    x = torch.randn(9, 32)
    cos, sin = _tables(9, 16)
    with torch.no_grad():
        expected = attention(x, cos, sin)
        report = kiln.patch(attention)
        assert [r.op for r in report.replaced] == ["rope"]
        compiled, graphs = compile_capturing(attention)
        actual = compiled(x, cos, sin)
    torch._dynamo.reset()
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.rope.default)) == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_patched_vision_attention_backward_matches():
    """kiln.rope's backward through the fp32 table: the gradients of x and of the projection."""
    torch.manual_seed(0)
    plain, patched = _QwenVisionAttention(), _QwenVisionAttention()
    patched.load_state_dict(plain.state_dict())
    kiln.patch(patched)
    x = torch.randn(9, 32)
    cos, sin = _tables(9, 16)
    grads = []
    for module in (plain, patched):
        xi = x.clone().requires_grad_()
        (module(xi, cos, sin) ** 2).sum().backward()
        grads.append((xi.grad, module.qkv.weight.grad))
    for expected, actual in zip(*grads):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# --- the two-layer GELU MLPs ----------------------------------------------------------------------

def _siglip(dtype=torch.float32, activation="gelu_pytorch_tanh"):
    torch.manual_seed(0)
    config = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                image_size=28, patch_size=14, hidden_act=activation)
    return SiglipVisionModel(config).eval().to(dtype)


def _images(seed=0):
    return torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(seed))


def _pooled(model, images):
    with torch.no_grad():
        return model(pixel_values=images.to(next(model.parameters()).dtype)).pooler_output


@pytest.mark.parametrize("activation, approximate", [("gelu_pytorch_tanh", "tanh"), ("gelu", "none")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_siglip_mlps_run_kiln_gelu(activation, approximate, dtype, monkeypatch):
    """SigLIP's encoder MLPs and its pooling head's: ``fc2(gelu(fc1(x)))`` with kiln.gelu in the
    form the activation computes."""
    model = _siglip(dtype, activation)
    images = _images()
    expected = _pooled(model, images)
    truth = _pooled(_siglip(torch.float32, activation), images)
    report = kiln.patch(model)
    mlps = {r.path: r.kind for r in report.replaced if r.op == "gelu"}
    kind = "mlp gelu (tanh)" if approximate == "tanh" else "mlp gelu"
    assert mlps == {"encoder.layers.0.mlp": kind, "encoder.layers.1.mlp": kind, "head.mlp": kind}
    calls = _count(monkeypatch, activation_ops, "gelu")
    actual = _pooled(model, images)
    assert [(a[1], a[2]) for a, _ in calls] == [(None, approximate)] * 3
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        assert (actual.float() - truth).abs().max() <= 1.5 * (expected.float() - truth).abs().max() + 1e-3


def test_qwen3_vl_tower_runs_kiln_gelu_and_leaves_the_mergers(monkeypatch):
    """Qwen3-VL's blocks' MLPs (linear_fc1/linear_fc2, tanh GELU) are replaced; its patch mergers,
    which normalise before their MLP, are left with the reason."""
    tower = seeded(qwen3_vl)
    values, grid = pixels(tower)
    expected = embeddings(tower, values, grid)
    report = kiln.patch(tower)
    assert [r.path for r in report.replaced if r.op == "gelu"] == ["blocks.0.mlp", "blocks.1.mlp"]
    assert {l.path for l in report.left} == {"merger", "deepstack_merger_list.0"}
    assert all("it holds norm besides its projections" in l.reason for l in report.left)
    calls = _count(monkeypatch, activation_ops, "gelu")
    torch.testing.assert_close(embeddings(tower, values, grid), expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


def test_quick_gelu_is_left_with_the_reason():
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14)
    report = kiln.patch(CLIPVisionModel(config).eval())
    assert [(l.path, l.reason) for l in report.left] == [
        ("encoder.layers.0.mlp", "its activation_fn (QuickGELUActivation) is not GELU on a probe")]


class _DropoutMLP(torch.nn.Module):
    """Llama 4's projector: a dropout kept as a float, applied by the forward."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.activation_fn = torch.nn.GELU()
        self.dropout = 0.1

    def forward(self, x):
        x = self.activation_fn(self.fc1(x))
        return self.fc2(torch.nn.functional.dropout(x, p=self.dropout, training=self.training))


def test_a_forward_applying_dropout_is_left():
    report = kiln.patch(_DropoutMLP())
    assert [l.reason for l in report.left] == ["its forward applies a dropout, which kiln's would not"]


def test_an_activation_set_after_the_patch_runs_as_set(monkeypatch):
    model = _siglip()
    kiln.patch(model)
    mlp = model.encoder.layers[0].mlp
    mlp.activation_fn = torch.nn.SiLU()
    x = torch.randn(3, 32)
    calls = _count(monkeypatch, activation_ops, "gelu")
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), mlp.fc2(torch.nn.functional.silu(mlp.fc1(x))))
    assert calls == []
    assert gelu_mlp.candidate(mlp)


def test_patched_mlp_backward_matches():
    plain, patched = _siglip(), _siglip()
    kiln.patch(patched)
    images = _images()
    grads = []
    for model in (plain, patched):
        x = images.clone().requires_grad_()
        (model(pixel_values=x).pooler_output ** 2).sum().backward()
        grads.append((x.grad, model.encoder.layers[0].mlp.fc1.weight.grad))
    for expected, actual in zip(*grads):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_compiled_mlp_has_kiln_gelu_in_one_graph():
    model = _siglip()
    mlp = model.encoder.layers[0].mlp
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        expected = mlp(x)
        kiln.patch(mlp)
        compiled, graphs = compile_capturing(mlp)
        actual = compiled(x)
    torch._dynamo.reset()
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.gelu.default)) == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# --- the benches ----------------------------------------------------------------------------------

def test_the_vision_rope_bench_checks_kiln_against_transformers():
    """bench/vision_rope.py's cases, run on the CPU at small sizes: q and k strided views of one
    qkv, the fp32 table (MiniMax-M3-VL's: separate q and k, 78 of 80 columns by a bf16 table),
    kiln's replacement within bf16 rounding of transformers' function."""
    from bench_scripts import load_bench

    bench = load_bench("vision_rope")
    q, k = bench.packed_qk(6, 80, device="cpu")
    assert q.shape == (6, 16, 80) and q.stride(0) == 3 * 16 * 80
    bench.SHAPES = [("tiny", 6, 80, "qwen2_5_vl"), ("tiny 72", 5, 72, "qwen2_5_vl"), ("tiny MiniMax", 6, 80, "minimax_m3_vl")]
    if minimax_m3_vl() is None:
        bench.SHAPES = bench.SHAPES[:2]
    cases = list(bench.cases(quick=False, device="cpu"))
    assert [c["bytes"] for c in cases] == [2 * 2 * 2 * 6 * 16 * 80 + 2 * 6 * 80 * 4,
                                           2 * 2 * 2 * 5 * 16 * 72 + 2 * 5 * 72 * 4,
                                           2 * 2 * 2 * 6 * 16 * 80 + 2 * 6 * 78 * 2][:len(cases)]
    for case in cases:
        assert case["check"]() < 1e-2


@pytest.mark.parametrize("model, replaced", [
    ("qwen2.5-vl", {"rms_norm": 5, "rope": 2, "swiglu": 2}),
    ("qwen3-vl", {"layer_norm": 6, "rope": 2, "gelu": 2}),
    ("siglip", {"layer_norm": 6, "gelu": 3}),
    ("minimax-m3-vl", {"layer_norm": 5, "rope": 2, "gelu": 2})])
def test_vision_towers_bench_smoke_run(model, replaced, tmp_path):
    from test_e2e_bench_cpu import _smoke
    if model == "minimax-m3-vl" and minimax_m3_vl() is None:
        pytest.skip("this transformers has no MiniMax-M3-VL")

    out = _smoke("vision_towers.py", tmp_path, "--model", model)
    assert "| eager+kiln |" in out
    [doc_path] = tmp_path.glob(f"vision-tower-{model}-*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["patch"]["replaced"] == replaced
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2

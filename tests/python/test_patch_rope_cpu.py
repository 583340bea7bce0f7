"""kiln.patch of transformers' attention RoPE (the forward's global ``apply_rotary_pos_emb``
resolved to kiln.rope), on the CPU: what is replaced, what is left and why, and that the
module-level function every other model shares is untouched."""

import functools
import importlib

import pytest
import torch

import kiln
from kiln import rope_ops
from kiln.patching import rope_attention

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from transformers.models.llama import modeling_llama  # noqa: E402

from graph_model import calls_of, patched_and_compiled  # noqa: E402
from test_patch_cpu import _ids, _logits, _model  # noqa: E402


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Interleaved pairs (GPT-J style): what the attentions below call; not rotate_half."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate(x):
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)

    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


class _InterleavedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x, cos, sin):
        q = self.q_proj(x).unflatten(-1, (1, 8)).transpose(1, 2)
        k = self.k_proj(x).unflatten(-1, (1, 8)).transpose(1, 2)
        return apply_rotary_pos_emb(q, k, cos, sin)


def _count_rope(monkeypatch):
    calls = []
    original = rope_ops.rope
    monkeypatch.setattr(rope_ops, "rope", lambda *a, **k: calls.append(k.get("layout")) or original(*a, **k))
    return calls


def test_other_rotary_formula_is_left_with_the_reason():
    report = kiln.patch(_InterleavedAttention())
    assert report.replaced == []
    assert len(report.left) == 1 and report.left[0].path == ""
    assert "apply_rotary_pos_emb is neither rotate_half nor interleaved RoPE" in report.left[0].reason


def test_forward_wrapped_by_something_else_is_left():
    model = _model("llama")
    attn = model.model.layers[0].self_attn
    attn.forward = functools.partial(type(attn).forward, attn)
    report = kiln.patch(model)
    left = {l.path: l.reason for l in report.left}
    assert left == {"model.layers.0.self_attn": "its forward is not its class's own (something else wraps it)"}
    assert [r.path for r in report.replaced if r.op == "rope"] == ["model.layers.1.self_attn"]


def test_decorated_forward_is_not_a_candidate():
    class Decorated(_InterleavedAttention):
        @functools.wraps(_InterleavedAttention.forward)
        def forward(self, *args):
            return super().forward(*args)

    assert not rope_attention.candidate(Decorated())
    assert rope_attention.candidate(_InterleavedAttention())


def test_the_shared_function_stays_transformers_own(monkeypatch):
    shared = modeling_llama.apply_rotary_pos_emb
    patched, plain = _model("llama"), _model("llama")
    ids = _ids()
    kiln.patch(patched)
    assert modeling_llama.apply_rotary_pos_emb is shared
    calls = _count_rope(monkeypatch)
    _logits(plain, ids)
    assert calls == []  # the unpatched model of the same class does not reach kiln
    _logits(patched, ids)
    assert calls == ["bhsd", "bhsd"]
    kiln.unpatch(patched)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replacement_matches_the_formula(unsqueeze_dim, dtype, monkeypatch):
    g = torch.Generator().manual_seed(0)
    heads_first = unsqueeze_dim == 1
    q = torch.randn((2, 4, 7, 16) if heads_first else (2, 7, 4, 16), generator=g).to(dtype)
    k = torch.randn((2, 2, 7, 16) if heads_first else (2, 7, 2, 16), generator=g).to(dtype)
    angles = torch.rand(2, 7, 8, generator=g) * 30
    cos, sin = [f(torch.cat((angles, angles), -1)).to(dtype) for f in (torch.cos, torch.sin)]
    calls = _count_rope(monkeypatch)
    replacement = rope_attention.rotate_half_rope(modeling_llama.apply_rotary_pos_emb)
    actual = replacement(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    expected = modeling_llama.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double(),
                                                   unsqueeze_dim)
    assert calls == ["bhsd" if heads_first else "bshd"]
    tol = 1e-6 if dtype == torch.float32 else 2**-7
    for a, e in zip(actual, expected):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), e, rtol=tol, atol=tol)


def test_fp32_table_with_half_q_keeps_the_formula(monkeypatch):
    """The formula promotes a bf16 q times an fp32 table to fp32; kiln would return bf16."""
    q, k = torch.randn(1, 2, 3, 8).bfloat16(), torch.randn(1, 1, 3, 8).bfloat16()
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    calls = _count_rope(monkeypatch)
    out = rope_attention.rotate_half_rope(modeling_llama.apply_rotary_pos_emb)(q, k, cos, sin)
    assert calls == [] and out[0].dtype == torch.float32
    assert rope_attention.rope_layout(q, k, cos, sin, 1) is None
    assert rope_attention.rope_layout(q, k, cos.bfloat16(), sin.bfloat16(), 1) == "bhsd"
    assert rope_attention.rope_layout(q, k, cos.bfloat16(), sin.bfloat16(), 3) is None


@pytest.mark.parametrize("arch, op, absent", [("llama", "rope", "head_norm_rope"),
                                              ("qwen3", "head_norm_rope", "rope"),
                                              ("gemma3", "head_norm_rope", "rope"),
                                              ("phi3", "rope", "head_norm_rope"),
                                              ("glm4", "rope", "head_norm_rope")])
def test_compiled_patched_model_has_kiln_rope_in_one_graph(arch, op, absent):
    """Qwen3's and Gemma 3's q/k norms join the rotation in head_norm_rope (see
    test_patch_head_norm_cpu.py); Llama's attention has none."""
    model = _model(arch)
    ids = _ids()
    expected, actual, graphs = patched_and_compiled(model, lambda m: _logits(m, ids))
    assert len(graphs) == 1 and len(calls_of(graphs, getattr(torch.ops.kiln, op).default)) == 2
    assert calls_of(graphs, getattr(torch.ops.kiln, absent).default) == []
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    kiln.unpatch(model)


def test_a_fifth_argument_of_another_meaning_keeps_the_formula(monkeypatch):
    """Older transformers took ``position_ids`` after (q, k, cos, sin): such a call is the
    original's, whatever the value."""
    def older(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    calls = _count_rope(monkeypatch)
    replacement = rope_attention.rotate_half_rope(older)
    replacement(q, k, cos, sin, 1)
    replacement(q, k, cos, sin, None, 1)
    assert calls == []
    replacement(q, k, cos, sin, unsqueeze_dim=1)
    replacement(q, k, cos, sin)
    assert calls == ["bhsd", "bhsd"]


def test_attentions_of_one_class_share_one_kiln_forward():
    model = _model("llama")
    kiln.patch(model)
    forwards = [layer.self_attn.forward for layer in model.model.layers]
    assert len({f.__func__ for f in forwards}) == 1
    assert [f.__self__ for f in forwards] == [layer.self_attn for layer in model.model.layers]
    kiln.unpatch(model)


def _gpt_oss():
    """A small GPT-OSS, whose rotary embedding makes [B, S, D / 2] tables."""
    if not hasattr(transformers, "GptOssForCausalLM"):
        pytest.skip("this transformers has no GPT-OSS")
    config = transformers.GptOssConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.GptOssForCausalLM(config).eval()


def test_gpt_oss_half_tables_reach_kiln(monkeypatch):
    """GPT-OSS's apply_rotary_pos_emb fails on [.., D] probes and takes one angle a pair: its
    attentions are patched to kiln.rope with that table, with the model's logits."""
    model = _gpt_oss()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = _logits(model, ids)
    report = kiln.patch(model)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert [r.path for r in ropes] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all("one angle a pair" in r.kind for r in ropes)
    calls = _count_rope(monkeypatch)
    actual = _logits(model, ids)
    assert calls == ["bhsd", "bhsd"]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    kiln.unpatch(model)


def test_each_table_form_takes_only_its_own_width():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    tables = {w: torch.randn(1, 3, w) for w in (2, 3, 4, 6, 8, 10)}

    def widths(form):
        return [w for w, t in tables.items() if rope_attention.rope_layout(q, k, t, t, 1, form) == "bhsd"]

    assert widths("full") == [8]
    assert widths("half") == [4]
    assert widths("partial") == [2, 4, 6, 8]  # even, at most the head
    assert widths("interleaved") == [2, 4, 6, 8]


def test_a_two_dimensional_table_lines_up_with_the_positions_only_in_bshd():
    """[S, D] unsqueezed at 1 meets q's heads, not its positions: the formula's own business."""
    q, k, table = torch.randn(1, 3, 3, 8), torch.randn(1, 3, 3, 8), torch.randn(3, 8)
    assert rope_attention.rope_layout(q, k, table, table, 1) is None
    assert rope_attention.rope_layout(q, k, table, table, 2) == "bshd"


def _rope_of_q_alone(q, k=None, cos=None, sin=None, unsqueeze_dim=1):
    """A function that also rotates q alone (an indexer's), k optional."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    q_out = q * cos + modeling_llama.rotate_half(q) * sin
    return q_out if k is None else (q_out, k * cos + modeling_llama.rotate_half(k) * sin)


class _Indexer(torch.nn.Module):
    """Rotates q alone, passing the tables by name: only (q, k, cos, sin) calls reach kiln."""

    def forward(self, q, k, cos, sin):
        alone = apply_rotary_pos_emb(q, cos=cos, sin=sin)
        both = apply_rotary_pos_emb(q, k, cos, sin)
        return alone, both


def test_calls_of_another_form_run_the_original(monkeypatch):
    module_globals = _Indexer.forward.__globals__
    monkeypatch.setitem(module_globals, "apply_rotary_pos_emb", _rope_of_q_alone)
    indexer = _Indexer()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    angles = torch.rand(1, 3, 4, generator=g) * 10
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    expected = indexer(q, k, cos, sin)
    report = kiln.patch(indexer)
    assert [r.op for r in report.replaced] == ["rope"]
    calls = _count_rope(monkeypatch)
    actual = indexer(q, k, cos, sin)
    assert calls == ["bhsd"]  # the (q, k, cos, sin) call only
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)
    for a, e in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    kiln.unpatch(indexer)


def _count_rope_calls(monkeypatch):
    """(layout, interleaved, table width, rotary_dim) of each kiln.rope call."""
    calls = []
    original = rope_ops.rope

    def counted(q, k, cos, sin, interleaved=False, rotary_dim=-1, layout="bhsd", head_dim=-1):
        calls.append((layout, interleaved, cos.shape[-1], rotary_dim))
        return original(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim)

    monkeypatch.setattr(rope_ops, "rope", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_phi3_rotates_the_first_columns_of_each_head_with_kiln(dtype, monkeypatch):
    """Phi-3's apply_rotary_pos_emb rotates the table's width of each head and passes the rest
    (partial_rotary_factor; Phi-4-mini's is 0.75): one kiln.rope with rotary_dim the table's."""
    model = _model("phi3", dtype)
    ids = _ids()
    expected = _logits(model, ids)
    report = kiln.patch(model)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert [r.path for r in ropes] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all("the first rotary_dim columns" in r.kind and "rotate_half" in r.kind for r in ropes)
    calls = _count_rope_calls(monkeypatch)
    actual = _logits(model, ids)
    assert calls == [("bhsd", False, 8, -1)] * 2  # heads of 16, half of them rotated
    tol = 1e-5 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glm4_interleaved_pairs_reach_kiln(dtype, monkeypatch):
    """GLM's apply_rotary_pos_emb rotates adjacent pairs of the first columns, each by an angle
    of the table's first half: kiln.rope interleaved, with that half as a table of one angle
    a pair."""
    model = _model("glm4", dtype)
    ids = _ids()
    expected = _logits(model, ids)
    report = kiln.patch(model)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert len(ropes) == 2 and all("interleaved pairs" in r.kind for r in ropes)
    calls = _count_rope_calls(monkeypatch)
    actual = _logits(model, ids)
    assert calls == [("bhsd", True, 4, 8)] * 2
    tol = 1e-5 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)


@pytest.mark.parametrize("arch", ["phi3", "glm4"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("rotated", [16, 8, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_replacements_match_the_formula(arch, unsqueeze_dim, rotated, dtype, monkeypatch):
    """Phi-3's and GLM's functions against kiln on fresh random q, k and tables in each
    layout, rotating all of a head, half, or an odd count of pairs; against the formula in fp64."""
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    form = "partial" if arch == "phi3" else "interleaved"
    g = torch.Generator().manual_seed(rotated)
    heads_first = unsqueeze_dim == 1
    q = torch.randn((2, 4, 7, 16) if heads_first else (2, 7, 4, 16), generator=g).to(dtype)
    k = torch.randn((2, 2, 7, 16) if heads_first else (2, 7, 2, 16), generator=g).to(dtype)
    angles = torch.rand(2, 7, rotated // 2, generator=g) * 30
    cos, sin = [f(torch.cat((angles, angles), -1)).to(dtype) for f in (torch.cos, torch.sin)]
    calls = _count_rope_calls(monkeypatch)
    actual = rope_attention.rotate_half_rope(module.apply_rotary_pos_emb, form)(q, k, cos, sin,
                                                                               unsqueeze_dim=unsqueeze_dim)
    expected = module.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim)
    assert len(calls) == 1 and calls[0][:2] == ("bhsd" if heads_first else "bshd", form == "interleaved")
    tol = 1e-6 if dtype == torch.float32 else 2**-7
    for a, e in zip(actual, expected):
        assert a.dtype == dtype and a.shape == e.shape
        torch.testing.assert_close(a.double(), e, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["gpt_oss", "deepseek_v3", "llama4"])
def test_compiled_model_has_kiln_rope_in_one_graph(name):
    """GPT-OSS's half tables, DeepSeek-V3's de-interleaved latent RoPE and Llama 4's complex
    frequencies, under torch.compile."""
    model = {"gpt_oss": _gpt_oss, "deepseek_v3": lambda: _deepseek_v3(True),
             "llama4": lambda: _complex_rope_model("llama4")}[name]()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    expected, actual, graphs = patched_and_compiled(model, lambda m: _logits(m, ids))
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.rope.default)) == 2
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    kiln.unpatch(model)


def _deepseek_v3(rope_interleave, dtype=torch.float32, dense_layers=1):
    """A tiny DeepSeek-V3: latent attention whose q and k rotate the last 8 columns of each head
    (one k head), de-interleaved where rope_interleave is set; its first `dense_layers` layers
    with a dense MLP, the rest with experts."""
    if not hasattr(transformers, "DeepseekV3Config"):
        pytest.skip("transformers has no DeepSeek-V3")
    config = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=dense_layers, n_group=1, topk_group=1, rope_interleave=rope_interleave, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(config).eval().to(dtype)


@pytest.mark.parametrize("rope_interleave", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_v3_latent_attention_rope_reaches_kiln(rope_interleave, dtype, monkeypatch):
    """DeepSeek-V3's attention calls apply_rotary_pos_emb_interleave (rope_interleave) or
    apply_rotary_pos_emb on its q_rot and k_rot views: both are replaced, and each forward's
    rotation is one kiln.rope, de-interleaving from the first half of the table or not."""
    model = _deepseek_v3(rope_interleave, dtype)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = _logits(model, ids)
    report = kiln.patch(model)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert [r.path for r in ropes] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all("rotate_half" in r.kind and "apply_rotary_pos_emb_interleave" in r.kind for r in ropes)
    calls = []
    original = rope_ops.rope
    monkeypatch.setattr(rope_ops, "rope", lambda q, k, cos, *a, **kw: calls.append(
        (tuple(q.shape), tuple(k.shape), cos.shape[-1], kw.get("deinterleave", False))) or original(q, k, cos, *a, **kw))
    actual = _logits(model, ids)
    assert calls == [((2, 4, 9, 8), (2, 1, 9, 8), 4 if rope_interleave else 8, rope_interleave)] * 2
    tol = 1e-5 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)


def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Pairs turned by the first half of the table as DeepSeek-V3's are, but written back
    adjacent: not DeepSeek's (whose output is de-interleaved)."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)

    def rotate(x):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)

    return rotate(q), rotate(k)


class _AdjacentPairsAttention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb_interleave(q, k, cos, sin)


def test_a_different_interleave_function_is_left_with_the_reason():
    report = kiln.patch(_AdjacentPairsAttention())
    assert report.replaced == [] and len(report.left) == 1
    assert "apply_rotary_pos_emb_interleave is not DeepSeek-V3's de-interleaving RoPE" in report.left[0].reason


def _complex_rope_model(name, dtype=torch.float32):
    """A tiny Llama 4 (q and k [B, S, H, D] at the rotation) or DeepSeek-V2 ([B, H, S, D]), both
    rotating adjacent pairs by complex frequencies through a global apply_rotary_emb."""
    if name == "llama4":
        from test_patch_bmm_experts_cpu import _model as llama4
        return llama4(dtype)
    if not hasattr(transformers, "DeepseekV2Config"):
        pytest.skip("transformers has no DeepSeek-V2")
    config = transformers.DeepseekV2Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval().to(dtype)


@pytest.mark.parametrize("name, layout, q_shape, k_shape", [
    ("llama4", "bshd", (2, 9, 4, 16), (2, 9, 2, 16)), ("deepseek_v2", "bhsd", (2, 4, 9, 8), (2, 1, 9, 8))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_frequency_rope_reaches_kiln(name, layout, q_shape, k_shape, dtype, monkeypatch):
    """Llama 4's and DeepSeek-V2's apply_rotary_emb(q, k, freqs_cis): each forward's rotation is
    one kiln.rope of interleaved pairs from the frequencies' real and imaginary parts (fp32
    tables), in the layout the function broadcasts over."""
    model = _complex_rope_model(name, dtype)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = _logits(model, ids)
    report = kiln.patch(model)
    ropes = [r for r in report.replaced if r.op == "rope"]
    assert len(ropes) == 2 and all(f"apply_rotary_emb, q and k [{layout}]" in r.kind for r in ropes)
    calls = []
    original = rope_ops.rope
    monkeypatch.setattr(rope_ops, "rope", lambda q, k, cos, *a, **kw: calls.append(
        (tuple(q.shape), tuple(k.shape), cos.dtype, kw["interleaved"], kw["layout"])) or original(q, k, cos, *a, **kw))
    actual = _logits(model, ids)
    assert calls == [(q_shape, k_shape, torch.float32, True, layout)] * 2
    tol = 1e-5 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)


def apply_rotary_emb(xq, xk, freqs_cis):
    """Complex frequencies applied conjugated: not the rotation kiln computes."""
    def turn(x):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs_cis[:, :, None, :].conj()).flatten(3).type_as(x)

    return turn(xq), turn(xk)


class _ConjugateAttention(torch.nn.Module):
    def forward(self, q, k, freqs_cis):
        return apply_rotary_emb(q, k, freqs_cis)


def test_complex_rope_of_another_rotation_is_left_with_the_reason():
    report = kiln.patch(_ConjugateAttention())
    assert report.replaced == [] and len(report.left) == 1
    assert "apply_rotary_emb is not RoPE by complex frequencies" in report.left[0].reason


def test_complex_rope_calls_of_another_shape_run_the_original():
    """A complex128 table, or one whose positions do not match q's, keeps the formula."""
    replacement = rope_attention.complex_rope(apply_rotary_emb, "bshd")
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    for freqs in (torch.polar(torch.ones(1, 3, 4, dtype=torch.float64), torch.rand(1, 3, 4, dtype=torch.float64)),
                  torch.polar(torch.ones(1, 1, 4), torch.rand(1, 1, 4))):
        expected = apply_rotary_emb(q, k, freqs)
        actual = replacement(q, k, freqs)
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a, e, rtol=0, atol=0)

"""kiln.patch of transformers' attentions that RMS-normalise each head of q and k right before
their RoPE (Qwen3, Gemma 3): which forwards are rewritten to hand the norms to one
kiln.head_norm_rope, which are not and why, and where the rewritten forward still calls the
norm modules (autograd, hooks, dtypes and eps kiln's fused op does not take), on the CPU."""

import pytest
import torch

import kiln
from kiln import rope_ops
from kiln.patching import head_norm_attention, replace

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

from test_patch_cpu import _Counter, _ids, _logits, _model  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


class _Attention(torch.nn.Module):
    """Qwen3's prologue, written as Qwen3Attention writes it."""

    def __init__(self, norm=Qwen3RMSNorm):
        super().__init__()
        self.head_dim = HEAD_DIM
        self.q_proj = torch.nn.Linear(32, HEADS * HEAD_DIM, bias=False)
        self.k_proj = torch.nn.Linear(32, KV_HEADS * HEAD_DIM, bias=False)
        self.q_norm, self.k_norm = norm(HEAD_DIM, eps=1e-6), norm(HEAD_DIM, eps=1e-6)
        with torch.no_grad():
            self.q_norm.weight.copy_(1 + 0.3 * torch.randn(HEAD_DIM))
            self.k_norm.weight.copy_(1 + 0.3 * torch.randn(HEAD_DIM))

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _ReadBetween(_Attention):
    """The norm's result is read before the rotation (kept for something else)."""

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        self.normed = query_states
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _AcrossHeads(_Attention):
    """OLMo 2's order: the norm runs over all heads, before the head split."""

    def __init__(self):
        super().__init__()
        self.q_norm = Qwen3RMSNorm(HEADS * HEAD_DIM)
        self.k_norm = Qwen3RMSNorm(KV_HEADS * HEAD_DIM)

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x))
        key_states = self.k_norm(self.k_proj(x))
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _InABranch(_Attention):
    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_proj(x).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(x).view(hidden_shape).transpose(1, 2)
        if self.head_dim > 0:
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _OtherTranspose(_Attention):
    """The norm's result transposed along its last dimension: not a norm of q's rows."""

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(2, 3)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(2, 3)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _WithSuper(_Attention):
    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        super().extra_repr()
        return query_states, key_states


class _ReadAfter(_Attention):
    """The normalised q is returned beside the rotated one: the rotation must rebind it."""

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        q_rotated, k_rotated = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return q_rotated, k_rotated, query_states


class _ReadByTheRotation(_Attention):
    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos * query_states.amax(), sin)
        return query_states, key_states


class _InPlaceBetween(_Attention):
    """The norm's argument changed in place before the rotation: the norm had read it first."""

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        raw = self.q_proj(x).view(hidden_shape)
        query_states = self.q_norm(raw).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        raw.mul_(0)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _Closure(_Attention):
    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        peek = lambda: query_states.abs().mean()  # noqa: E731
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        cos = cos * peek()
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _Locals(_Attention):
    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        cos = cos * locals()["query_states"].abs().mean()
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _Private(_Attention):
    """A private name: mangled in the class body, not in a recompilation outside it."""

    def __init__(self):
        super().__init__()
        self.__scale = 1.0

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos * self.__scale, sin)
        return query_states, key_states


class _ThreeDims(_Attention):
    """One head, [B, S, D]: its .transpose(1, 2) moves the normalised dimension."""

    def forward(self, x, cos, sin):
        query_states = self.q_norm(self.q_proj(x)[..., :HEAD_DIM]).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x)[..., :HEAD_DIM]).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states


class _PerHeadLayerNorm(torch.nn.LayerNorm):
    def __init__(self, dim, eps):
        super().__init__(dim, eps=eps)


def _inputs(dtype, seed=0, batch=2, seq=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, 32, generator=g).to(dtype)
    angles = torch.rand(batch, seq, HEAD_DIM // 2, generator=g) * 20.0
    emb = torch.cat((angles, angles), dim=-1)
    return x, emb.cos().to(dtype), emb.sin().to(dtype)


def _count(monkeypatch):
    counts = {"head_norm_rope": 0, "rope": 0}
    for name in counts:
        original = getattr(rope_ops, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(rope_ops, name, counted)
    return counts


def _rope_kind(module):
    report = kiln.patch(module)
    kinds = {r.path: r.kind for r in report.replaced}
    return kinds.get("")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rewritten_forward_is_one_head_norm_rope(dtype, monkeypatch):
    module = _Attention().to(dtype)
    x, cos, sin = _inputs(dtype)
    with torch.no_grad():
        expected = module(x, cos, sin)
        assert _rope_kind(module) == "per-head q/k rms_norm + rope (in the attention's forward)"
        counts = _count(monkeypatch)
        actual = module(x, cos, sin)
    assert counts == {"head_norm_rope": 1, "rope": 0}
    # Against the same prologue in fp64: the eager bf16 chain rounds after each op.
    with torch.no_grad():
        kiln.unpatch(module)
        truth = _Attention.forward(module.double(), *(t.double() for t in (x, cos, sin)))
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6
    for a, e, t in zip(actual, expected, truth):
        assert a.dtype == e.dtype == dtype and a.shape == e.shape
        torch.testing.assert_close(a.double(), t, rtol=tol, atol=tol)


@pytest.mark.parametrize("cls, why", [
    (_ReadBetween, "the norm's result is read before the rotation"),
    (_AcrossHeads, "the norm runs before the head split"),
    (_InABranch, "the norms are in a branch"),
    (_WithSuper, "the forward uses super()"),
    (_ReadByTheRotation, "the rotation's table reads the norm's result"),
    (_InPlaceBetween, "the norm's argument changes in place before the rotation"),
    (_Closure, "a closure reads the norm's result"),
    (_Locals, "locals() reads the norm's result"),
    (_Private, "a private name would not be mangled"),
])
def test_forwards_not_written_for_it_keep_kiln_rope(cls, why, monkeypatch):
    module = cls()
    assert head_norm_attention.rewritten_code(cls.forward) is None, why
    x, cos, sin = _inputs(torch.float32)
    with torch.no_grad():
        expected = module(x, cos, sin)
        assert _rope_kind(module) == "rope (rotate_half, in the attention's forward)"
        counts = _count(monkeypatch)
        actual = module(x, cos, sin)
    assert counts == {"head_norm_rope": 0, "rope": 1}
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_a_transpose_of_the_last_dimension_is_not_rewritten():
    assert head_norm_attention.rewritten_code(_OtherTranspose.forward) is None
    assert head_norm_attention.rewritten_code(_Attention.forward) is not None


def test_a_result_read_after_the_rotation_keeps_the_norms():
    module = _ReadAfter()
    assert head_norm_attention.rewritten_code(_ReadAfter.forward) is None
    x, cos, sin = _inputs(torch.float32)
    with torch.no_grad():
        expected = module(x, cos, sin)
        kiln.patch(module)
        actual = module(x, cos, sin)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_three_dimensional_heads_keep_the_norms_order(monkeypatch):
    """The rewrite is made (the syntax cannot tell the rank); the fused op takes 4-D q and k
    only, and the norms run on the tensors as they were before the transpose."""
    module = _ThreeDims()
    assert head_norm_attention.rewritten_code(_ThreeDims.forward) is not None
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 32, generator=g)
    # Tables that broadcast over the [B, D, S] results: the forward computes, whatever it means.
    cos, sin = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    with torch.no_grad():
        expected = module(x, cos, sin)
        kiln.patch(module)
        counts = _count(monkeypatch)
        actual = module(x, cos, sin)
    assert counts["head_norm_rope"] == 0
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_source_changed_since_import_is_not_rewritten(tmp_path, monkeypatch):
    import importlib

    source = '''
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


class Attention(torch.nn.Module):
    def forward(self, x, cos, sin):
        query_states = self.q_norm(self.q_proj(x)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states
'''
    (tmp_path / "edited_attention.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_attention")
    assert head_norm_attention.rewritten_code(module.Attention.forward) is not None
    (tmp_path / "edited_attention.py").write_text(source.replace("key_states, cos, sin)", "key_states, sin, cos)"))
    import linecache
    linecache.checkcache()
    assert head_norm_attention.rewritten_code(module.Attention.forward) is None


def test_layer_norms_per_head_are_not_fused():
    module = _Attention(norm=_PerHeadLayerNorm)
    assert head_norm_attention.rewritten_code(_Attention.forward) is not None
    assert _rope_kind(module) == "rope (rotate_half, in the attention's forward)"


def test_transformers_forwards_that_are_rewritten():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeAttention

    for cls in (Qwen3Attention, Qwen3MoeAttention, Gemma3Attention):
        code = head_norm_attention.rewritten_code(cls.forward)
        assert code is not None, cls.__name__
        # Tracebacks and torch.compile's messages point at transformers' own lines.
        assert code.co_filename == cls.forward.__code__.co_filename
        assert code.co_firstlineno == cls.forward.__code__.co_firstlineno
        assert head_norm_attention.FUSED_GLOBAL in code.co_names and "q_norm" in code.co_names
    for cls in (LlamaAttention, Olmo2Attention):  # no norms; norms across all heads
        assert head_norm_attention.rewritten_code(cls.forward) is None, cls.__name__


def test_recording_a_graph_calls_the_norms_then_kiln_rope(monkeypatch):
    """head_norm_rope has no backward: with a graph to record, the norm modules run (patched as
    norms) and the rotation is kiln.rope's, and the gradients are the original's."""
    module = _Attention()
    x, cos, sin = _inputs(torch.float32)
    x.requires_grad_(True)
    expected = module(x, cos, sin)
    sum(t.pow(2).sum() for t in expected).backward()
    grads = [p.grad.clone() for p in module.parameters()] + [x.grad.clone()]
    module.zero_grad()
    x.grad = None
    kiln.patch(module)
    counts = _count(monkeypatch)
    actual = module(x, cos, sin)
    sum(t.pow(2).sum() for t in actual).backward()
    assert counts == {"head_norm_rope": 0, "rope": 1}
    for a, e in zip(list(module.parameters()) + [x], grads):
        torch.testing.assert_close(a.grad, e, rtol=1e-4, atol=1e-5)


def test_a_hook_on_a_norm_runs_on_what_it_saw(monkeypatch):
    module = _Attention()
    x, cos, sin = _inputs(torch.float32)
    kiln.patch(module)
    seen = []
    module.k_norm.register_forward_hook(lambda m, args, out: seen.append((args[0].shape, out.clone())))
    counts = _count(monkeypatch)
    with torch.no_grad():
        actual = module(x, cos, sin)
        kiln.unpatch(module)
        expected = module(x, cos, sin)
    assert counts == {"head_norm_rope": 0, "rope": 1}
    # The norm runs on the projection's [B, S, H, D] layout, as the original forward calls it.
    assert [shape for shape, _ in seen] == [torch.Size([2, 5, KV_HEADS, HEAD_DIM])] * 2
    torch.testing.assert_close(seen[0][1], seen[1][1], rtol=1e-5, atol=1e-5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_trained_norm_weights_with_frozen_projections_call_the_norms(monkeypatch):
    """q and k need no graph, the norms' weights do: head_norm_rope has no backward."""
    module = _Attention()
    module.q_proj.requires_grad_(False)
    module.k_proj.requires_grad_(False)
    x, cos, sin = _inputs(torch.float32)
    kiln.patch(module)
    counts = _count(monkeypatch)
    out = module(x, cos, sin)
    sum(t.sum() for t in out).backward()
    assert counts == {"head_norm_rope": 0, "rope": 1}
    assert module.q_norm.weight.grad is not None and module.k_norm.weight.grad is not None


def test_a_norm_forward_replaced_after_the_patch_is_called(monkeypatch):
    module = _Attention()
    x, cos, sin = _inputs(torch.float32)
    kiln.patch(module)
    module.q_norm.forward = lambda t: 2 * t
    counts = _count(monkeypatch)
    with torch.no_grad():
        q, _ = module(x, cos, sin)
    assert counts == {"head_norm_rope": 0, "rope": 1}
    hidden_shape = (*x.shape[:-1], -1, HEAD_DIM)
    raw_q = module.q_proj(x).view(hidden_shape).transpose(1, 2)
    expected, _ = apply_rotary_pos_emb(2 * raw_q, raw_q[:, :KV_HEADS], cos, sin)
    torch.testing.assert_close(q, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["fp32 weights, bf16 q", "two eps", "a weight of another size"])
def test_what_head_norm_rope_does_not_take_calls_the_norms(change, monkeypatch):
    module = _Attention().to(torch.bfloat16)
    kiln.patch(module)
    if change == "fp32 weights, bf16 q":
        module.q_norm.float()
        module.k_norm.float()
    elif change == "two eps":
        module.k_norm.variance_epsilon = 1e-5
    else:
        module.q_norm.weight = torch.nn.Parameter(torch.ones(2 * HEAD_DIM, dtype=torch.bfloat16))
    x, cos, sin = _inputs(torch.bfloat16)
    counts = _count(monkeypatch)
    with torch.no_grad():
        if change == "a weight of another size":
            with pytest.raises((RuntimeError, ValueError)):  # the norm module's error
                module(x, cos, sin)
            return
        actual = module(x, cos, sin)
        kiln.unpatch(module)
        expected = module(x, cos, sin)
    assert counts["head_norm_rope"] == 0
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a.double(), e.double(), rtol=2 ** -6, atol=2 ** -6)


def test_a_probe_that_disagrees_is_reported():
    module = _Attention()
    # Qwen3's norms read as Gemma's 1 + weight: the probe tells them apart.
    why = head_norm_attention._probe_disagrees(module, head_norm_attention.WEIGHT_PLUS_ONE, apply_rotary_pos_emb)
    assert why is not None and why.startswith("on a torch.float32 probe kiln.head_norm_rope differs")
    assert head_norm_attention._probe_disagrees(module, head_norm_attention.WEIGHT_AS_IS, apply_rotary_pos_emb) is None


def test_the_probe_runs_no_hook():
    module = _Attention()
    calls = []
    module.q_norm.register_forward_hook(lambda *args: calls.append(1))
    assert head_norm_attention._probe_disagrees(module, head_norm_attention.WEIGHT_AS_IS, apply_rotary_pos_emb) is None
    assert calls == []


def test_attentions_of_one_class_share_one_forward(monkeypatch):
    model = _model("qwen3")
    kiln.patch(model)
    first, second = (layer.self_attn for layer in model.model.layers)
    patched = [replace.state_of(a).patched for a in (first, second)]
    assert patched[0].__func__ is patched[1].__func__
    assert head_norm_attention.FUSED_GLOBAL in patched[0].__func__.__globals__
    counter = _Counter(monkeypatch)
    _logits(model, _ids())
    assert counter.calls["head_norm_rope"] == 2 and counter.calls["rope"] == 0
    kiln.unpatch(model)


def test_the_ops_filter_knows_it_as_rope():
    model = _model("qwen3")
    report = kiln.patch(model, ops=["rms_norm"])
    left = {l.path: l.reason for l in report.left if l.path.endswith("self_attn")}
    assert left == {f"model.layers.{i}.self_attn":
                    "computes per-head q/k rms_norm + rope (in the attention's forward); rope is not in ops"
                    for i in range(2)}
    kiln.unpatch(model)
    # Without rms_norm the norms stay the model's own: the rotation alone is kiln's.
    report = kiln.patch(model, ops=["rope"])
    assert {r.op for r in report.replaced} == {"rope"}
    kiln.unpatch(model)


class _FlagNorm(torch.nn.Module):
    """An RMSNorm whose instances differ in their rule: 1 + weight (Gemma's) or weight."""

    def __init__(self, dim, eps, unit_offset=False):
        super().__init__()
        self.variance_epsilon, self.unit_offset = eps, unit_offset
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (y * (1.0 + self.weight.float() if self.unit_offset else self.weight.float())).type_as(x)


def test_a_head_norm_set_in_place_of_the_probed_one_is_called_as_a_module(monkeypatch):
    """A norm set after the patch in place of the probed one, of the same class but another
    rule, is not taken for it."""
    module = _Attention(norm=_FlagNorm)
    x, cos, sin = _inputs(torch.float32)
    kiln.patch(module)
    counts = _count(monkeypatch)
    with torch.no_grad():
        module(x, cos, sin)
    assert counts == {"head_norm_rope": 1, "rope": 0}
    replacement = _FlagNorm(HEAD_DIM, 1e-6, unit_offset=True)
    replacement.load_state_dict(module.q_norm.state_dict())
    module.q_norm = replacement
    with torch.no_grad():
        actual = module(x, cos, sin)
        kiln.unpatch(module)
        expected = module(x, cos, sin)
    assert counts == {"head_norm_rope": 1, "rope": 1}
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


# Qwen3-Next's and Qwen3.5's attentions normalise each head of q and k, then rotate its first
# rotary_dim columns (partial_rotary_factor 0.25), with a function that rotates the table's width.
def _partial():
    return pytest.importorskip("partial_head_norm_attention", reason="transformers has no Qwen3-Next")


def _partial_inputs(dtype, rotary_dim, seed=0, batch=2, seq=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, 32, generator=g).to(dtype)
    angles = torch.rand(batch, seq, rotary_dim // 2, generator=g) * 20.0
    emb = torch.cat((angles, angles), dim=-1)
    return x, emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [4, 8, HEAD_DIM])
def test_a_partial_rotation_is_one_head_norm_rope(dtype, rotary_dim, monkeypatch):
    """The norms and a rotation of the first rotary_dim columns: one kiln.head_norm_rope, whose
    columns past rotary_dim come out normalised, as the norms leave them; a full-width table
    through the same forward rotates every column."""
    partial = _partial()
    module = partial.PartialAttention().to(dtype)
    x, cos, sin = _partial_inputs(dtype, rotary_dim)
    with torch.no_grad():
        expected = module(x, cos, sin)
        assert _rope_kind(module) == ("per-head q/k rms_norm + rope (the first rotary_dim columns, "
                                      "in the attention's forward)")
        counts = _count(monkeypatch)
        actual = module(x, cos, sin)
    assert counts == {"head_norm_rope": 1, "rope": 0}
    with torch.no_grad():
        kiln.unpatch(module)
        truth = partial.PartialAttention.forward(module.double(), *(t.double() for t in (x, cos, sin)))
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6
    for a, e, t in zip(actual, expected, truth):
        assert a.dtype == e.dtype == dtype and a.shape == e.shape
        torch.testing.assert_close(a.double(), t, rtol=tol, atol=tol)


def test_a_partial_rotation_with_a_graph_calls_the_norms_then_kiln_rope(monkeypatch):
    module = _partial().PartialAttention()
    x, cos, sin = _partial_inputs(torch.float32, 8)
    x.requires_grad_(True)
    expected = module(x, cos, sin)
    grad_expected = torch.autograd.grad(sum(t.square().sum() for t in expected), x)[0]
    kiln.patch(module)
    counts = _count(monkeypatch)
    actual = module(x, cos, sin)
    grad_actual = torch.autograd.grad(sum(t.square().sum() for t in actual), x)[0]
    assert counts == {"head_norm_rope": 0, "rope": 1}
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_actual, grad_expected, rtol=1e-4, atol=1e-5)
    kiln.unpatch(module)


def test_a_partial_probe_checks_the_unrotated_columns():
    """The probe's tables are half the head: a head_norm_rope that rotated every column, or
    left the last ones unnormalised, would disagree with the norms and the partial rotation."""
    partial = _partial()
    module = partial.PartialAttention()
    rule = head_norm_attention.WEIGHT_AS_IS
    assert head_norm_attention._probe_disagrees(module, rule, partial.apply_rotary_pos_emb, "partial") is None
    # Qwen3's rotation takes no narrower table: the partial probe fails on it.
    why = head_norm_attention._probe_disagrees(module, rule, apply_rotary_pos_emb, "partial")
    assert why is not None and why.startswith("a torch.float32 probe fails")


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_qwen3_next_and_qwen3_5_attentions_fuse_their_partial_rotation(name, monkeypatch):
    """transformers' own attention modules, built from a tiny config: one head_norm_rope, as
    close to the fp64 prologue as the original module."""
    from linear_attention_models import PREFIX, tiny_config, transformers_modules

    modeling, _, _ = transformers_modules(name)
    config = tiny_config(name, layers=("full_attention",))
    torch.manual_seed(0)
    attention = getattr(modeling, f"{PREFIX[name]}Attention")(config, 0).eval()
    for norm in (attention.q_norm, attention.k_norm):
        with torch.no_grad():
            norm.weight.normal_(0, 0.3)
    # The tables as the models' rotary embeddings make them at partial_rotary_factor 0.25 (the
    # embeddings' own position formats differ between transformers versions).
    _, cos, sin = _partial_inputs(torch.float32, 4)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        expected = attention(x, (cos, sin), None)[0]
        report = kiln.patch(attention)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds[""] == "per-head q/k rms_norm + rope (the first rotary_dim columns, in the attention's forward)"
        counts = _count(monkeypatch)
        actual = attention(x, (cos, sin), None)[0]
    assert counts == {"head_norm_rope": 1, "rope": 0}
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    kiln.unpatch(attention)

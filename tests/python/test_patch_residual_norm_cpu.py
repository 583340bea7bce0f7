"""kiln.patch's decoder-layer rewrite (:mod:`kiln.patching.residual_norm_layer`): a residual
add followed by an RMSNorm of the sum becomes one kiln.fused_add_rms_norm (CPU).

The patched layers of transformers' models are checked against the unpatched ones in
test_patch_cpu.py (every architecture, fp32 and bf16, training, accelerate's hooks); here:
which forwards are rewritten, what the call does where kiln's op would not compute what the
module does, gradient checkpointing, torch.compile, and that a model's norms are probed once.
"""

import functools

import pytest
import torch

import kiln
from kiln import norm_ops
from kiln.patching import detect, residual_norm_layer

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

HIDDEN = 48


class _Block(torch.nn.Module):
    """A decoder layer's second half as transformers writes it."""

    def __init__(self, norm=None):
        super().__init__()
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.post_attention_layernorm = norm if norm is not None else LlamaRMSNorm(HIDDEN, eps=1e-5)
        with torch.no_grad():
            weight = getattr(self.post_attention_layernorm, "weight", None)
            if weight is not None:
                weight.copy_(1.0 + 0.3 * torch.randn(HIDDEN))

    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.proj(hidden_states)
        return residual + hidden_states


class _SumFirst(_Block):
    def forward(self, hidden_states, residual):
        hidden_states = hidden_states + residual
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


class _InABranch(_Block):
    def forward(self, hidden_states, residual, fuse=True):
        if fuse:
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


class _DropoutAddend(_Block):
    """Phi-3's: the block's output passes a dropout on its way to the residual stream."""

    def __init__(self):
        super().__init__()
        self.resid_attn_dropout = torch.nn.Dropout(0.25)

    def forward(self, hidden_states, residual):
        hidden_states = residual + self.resid_attn_dropout(hidden_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


class _ResidualSecond(_Block):
    """The sum in a third name, the residual added second."""

    def forward(self, hidden_states, residual):
        total = self.proj(hidden_states) * 0.5 + residual
        residual = total
        total = self.post_attention_layernorm(total)
        return residual + total


class _Apart(_Block):
    """A statement between the add and the norm."""

    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = hidden_states * 2
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


class _OtherTarget(_Block):
    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        normed = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(normed) + hidden_states


class _Cloned(_Block):
    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states.clone()
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


class _Closure(_Block):
    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return (lambda: residual + self.proj(hidden_states))()


class _Decorated(_Block):
    @torch.no_grad()
    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(hidden_states)


def _inputs(dtype=torch.float32, rows=(2, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*rows, HIDDEN, generator=g).to(dtype) for _ in range(2))


def _count(monkeypatch):
    counts = {"fused_add_rms_norm": 0}
    op = norm_ops.fused_add_rms_norm

    def counted(*args, **kwargs):
        counts["fused_add_rms_norm"] += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(norm_ops, "fused_add_rms_norm", counted)
    return counts


def _patched_and_original(block, inputs, monkeypatch):
    with torch.no_grad():
        expected = block(*inputs)
        report = kiln.patch(block)
        counts = _count(monkeypatch)
        actual = block(*inputs)
    return report, counts["fused_add_rms_norm"], actual, expected


@pytest.mark.parametrize("cls", [_Block, _SumFirst, _InABranch, _DropoutAddend, _ResidualSecond])
def test_add_then_norm_is_one_fused_call(cls, monkeypatch):
    torch.manual_seed(0)
    block = cls().eval()  # _DropoutAddend's dropout draws no mask
    report, fused, actual, expected = _patched_and_original(block, _inputs(), monkeypatch)
    assert ("", "fused_add_rms_norm") in [(r.path, r.op) for r in report.replaced]
    assert fused == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert kiln.unpatch(block) == 2  # the layer and its norm
    assert "forward" not in block.__dict__


def test_an_addend_expression_runs_as_written_in_training(monkeypatch):
    """The addend is evaluated where the add stood: in training mode Phi-3's dropout draws the
    same mask from the same generator state, so the fused call gives the original's sum and
    gradients."""
    torch.manual_seed(0)
    block = _DropoutAddend().train()
    h, r = (t.requires_grad_(True) for t in _inputs())
    torch.manual_seed(7)
    expected = block(h, r)
    expected.pow(2).mean().backward()
    grads = [t.grad.clone() for t in (h, r, block.post_attention_layernorm.weight)]
    for t in (h, r, block.post_attention_layernorm.weight):
        t.grad = None
    kiln.patch(block)
    counts = _count(monkeypatch)
    torch.manual_seed(7)
    actual = block(h, r)
    actual.pow(2).mean().backward()
    assert counts["fused_add_rms_norm"] == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip((h.grad, r.grad, block.post_attention_layernorm.weight.grad), grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    kiln.unpatch(block)


@pytest.mark.parametrize("cls", [_Apart, _OtherTarget, _Cloned, _Closure, _Decorated])
def test_other_forwards_are_not_rewritten(cls, monkeypatch):
    torch.manual_seed(0)
    block = cls()
    report, fused, actual, expected = _patched_and_original(block, _inputs(), monkeypatch)
    assert [r.op for r in report.replaced] == ["rms_norm"] and report.left == []
    assert fused == 0
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_layer_norm_after_the_add_leaves_the_layer_alone():
    """kiln has no fused add for a LayerNorm: the layer (CLIP's, Whisper's) is not a candidate,
    so the report does not list it."""
    block = _Block(torch.nn.LayerNorm(HIDDEN))
    report = kiln.patch(block)
    assert [(r.path, r.op) for r in report.replaced] == [("post_attention_layernorm", "layer_norm")]
    assert report.left == []


@pytest.mark.parametrize("norm", [
    lambda: torch.nn.RMSNorm(HIDDEN, eps=1e-6),
    lambda: torch.nn.RMSNorm(HIDDEN, elementwise_affine=False),
    lambda: __import__("transformers").models.gemma.modeling_gemma.GemmaRMSNorm(HIDDEN, eps=1e-6),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_norm_rules(norm, dtype, monkeypatch):
    torch.manual_seed(0)
    block = _Block(norm()).to(dtype)
    report, fused, actual, expected = _patched_and_original(block, _inputs(dtype), monkeypatch)
    assert fused == 1
    assert actual.dtype == expected.dtype
    # The layer's projection sums HIDDEN products of values a norm's rounding moved by an ulp.
    tol = 1e-5 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def _calls_the_module(block, inputs, monkeypatch):
    """(fused_add_rms_norm calls, calls of the norm module) of one patched call, which must
    give what the unpatched block gives."""
    expected = block(*inputs)
    kiln.patch(block)
    counts = _count(monkeypatch)
    seen = []
    hook = block.post_attention_layernorm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    actual = block(*inputs)
    hook.remove()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    return counts["fused_add_rms_norm"], len(seen)


def test_a_hooked_norm_is_called_as_a_module(monkeypatch):
    with torch.no_grad():
        assert _calls_the_module(_Block(), _inputs(), monkeypatch) == (0, 1)


@pytest.mark.parametrize("case", ["two dtypes", "broadcast", "weight of another dtype", "instance forward"])
def test_calls_kiln_cannot_take_run_the_add_and_the_module(case, monkeypatch):
    block = _Block()
    hidden, residual = _inputs()
    if case == "two dtypes":
        hidden = hidden.to(torch.bfloat16)
    elif case == "broadcast":
        residual = residual[:, :1]
    elif case == "weight of another dtype":
        block.post_attention_layernorm.to(torch.bfloat16)  # Llama's rule: an fp32 output
    with torch.no_grad():
        expected = block(hidden, residual)
        kiln.patch(block)
        if case == "instance forward":
            norm = block.post_attention_layernorm
            norm.forward = functools.partial(LlamaRMSNorm.forward, norm)
        counts = _count(monkeypatch)
        actual = block(hidden, residual)
    assert counts["fused_add_rms_norm"] == 0
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_training_gives_the_original_gradients(monkeypatch):
    torch.manual_seed(0)
    block = _Block()
    hidden, residual = (t.requires_grad_() for t in _inputs())
    block(hidden, residual).pow(2).sum().backward()
    expected = [p.grad.clone() for p in block.parameters()] + [hidden.grad.clone(), residual.grad.clone()]
    block.zero_grad()
    hidden.grad = residual.grad = None
    kiln.patch(block)
    counts = _count(monkeypatch)
    block(hidden, residual).pow(2).sum().backward()
    assert counts["fused_add_rms_norm"] == 1
    actual = [p.grad for p in block.parameters()] + [hidden.grad, residual.grad]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def _llama(layers=2, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def test_gradient_checkpointing_keeps_checkpointing(monkeypatch):
    """transformers' checkpointing layers (a wrapper around the class's forward in some
    versions, a __call__ of their own in others) still recompute the patched forward in the
    backward, and the gradients are the original's."""
    model = _llama().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    model(ids, use_cache=False).logits.pow(2).mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    kiln.patch(model)
    counts = _count(monkeypatch)
    model(ids, use_cache=False).logits.pow(2).mean().backward()
    assert counts["fused_add_rms_norm"] == 4  # each layer's forward, then again in the backward
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-4, atol=1e-6, msg=n)


def test_compiles_to_one_graph_with_the_fused_ops():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = _llama().eval()
    kiln.patch(model)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    counter = CompileCounterWithBackend("aot_eager")
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True, backend=counter)(ids).logits
    assert counter.frame_count == 1
    targets = [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    assert targets.count("kiln.fused_add_rms_norm.default") == 2
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_a_models_norms_are_probed_once(monkeypatch):
    """Every layer's norms are of one class and state: one classification for all of them,
    one probe of fused_add_rms_norm; a norm of another eps gets its own."""
    model = _llama(layers=6)
    model.model.layers[3].post_attention_layernorm.variance_epsilon = 1e-3
    classified, probed = [], []
    classify, probe = detect._classify_norm, residual_norm_layer.probe_disagrees
    monkeypatch.setattr(detect, "_classify_norm", lambda m, o: classified.append(m) or classify(m, o))
    monkeypatch.setattr(residual_norm_layer, "probe_disagrees", lambda n, r: probed.append(n) or probe(n, r))
    report = kiln.patch(model)
    assert sum(r.op == "fused_add_rms_norm" for r in report.replaced) == 6
    assert len(classified) == 2 and len(probed) == 2
    assert model.model.layers[3].post_attention_layernorm in classified


# ---- the seam between consecutive layers ----------------------------------------------


class _Layer(torch.nn.Module):
    """A decoder layer as transformers writes it: its input norm first, its last residual add
    returned."""

    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN, eps=1e-5)
        self.attn = torch.nn.Linear(HIDDEN, HIDDEN)
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN, eps=1e-5)
        self.mlp = torch.nn.Linear(HIDDEN, HIDDEN)
        with torch.no_grad():
            for norm in (self.input_layernorm, self.post_attention_layernorm):
                norm.weight.copy_(1.0 + 0.3 * torch.randn(HIDDEN))

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.attn(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class _Stack(torch.nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(layers))

    def forward(self, hidden_states):
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


def _count_ops(monkeypatch):
    from kiln import ops as kiln_ops

    counts = {"fused_add_rms_norm": 0, "rms_norm": 0}
    for module, name in ((norm_ops, "fused_add_rms_norm"), (kiln_ops, "rms_norm")):
        def counted(*args, _op=getattr(module, name), _name=name, **kwargs):
            counts[_name] += 1
            return _op(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return counts


def test_each_layer_hands_its_input_norm_to_the_next(monkeypatch):
    model = _Stack()
    x = _inputs()[0]
    with torch.no_grad():
        expected = model(x)
        kiln.patch(model)
        counts = _count_ops(monkeypatch)
        actual = model(x)
    # Three layers' add-then-norm triples, two seams; only the first layer's input norm alone.
    assert counts == {"fused_add_rms_norm": 5, "rms_norm": 1}
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def _by_hand(model, x, between):
    """The stack's layers called one by one, ``between(i, h)`` giving layer i's input."""
    h = x
    for i, layer in enumerate(model.layers):
        h = layer(between(i, h))
    return h


@pytest.mark.parametrize("case", ["changed in place", "another tensor", "norm weight changed",
                                  "hook on the next layer", "a layer skipped"])
def test_a_layer_takes_only_rows_made_of_its_very_input(case, monkeypatch):
    model = _Stack()
    x = _inputs()[0]

    def between(i, h):
        if i == 1 and case == "changed in place":
            return h.mul_(1.5)
        if i == 1 and case == "another tensor":
            return h * 1.0
        if i == 1 and case == "norm weight changed":
            model.layers[1].input_layernorm.weight.mul_(1.5)
        return h

    def run():
        if case == "a layer skipped":
            return model.layers[2](model.layers[0](x))
        return _by_hand(model, x, between)

    with torch.no_grad():
        state = {n: p.clone() for n, p in model.named_parameters()}
        expected = run()
        for n, p in model.named_parameters():
            p.copy_(state[n])
        kiln.patch(model)
        if case == "hook on the next layer":
            model.layers[1].register_forward_pre_hook(lambda module, args: None)
        counts = _count_ops(monkeypatch)
        actual = run()
    # Besides the first layer's, layer 1's input norm (layer 2's where layer 1 is skipped); a
    # hook on layer 1 (which may change its output too) stops both of its seams.
    assert counts["rms_norm"] == (3 if case == "hook on the next layer" else 2)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_no_seams_where_autograd_records(monkeypatch):
    model = _Stack()
    x = _inputs()[0].requires_grad_()
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    kiln.patch(model)
    counts = _count_ops(monkeypatch)
    model(x).sum().backward()
    assert counts == {"fused_add_rms_norm": 3, "rms_norm": 3}
    for a, e in zip([p.grad for p in model.parameters()] + [x.grad], expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


# ---- what the patched layer must not take for granted ----------------------------------


class _FlagNorm(torch.nn.Module):
    """An RMSNorm whose instances differ in their rule: 1 + weight (Gemma's) or weight."""

    def __init__(self, unit_offset):
        super().__init__()
        self.eps, self.unit_offset = 1e-6, unit_offset
        self.weight = torch.nn.Parameter(0.3 * torch.randn(HIDDEN))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float() if self.unit_offset else self.weight.float())).type_as(x)


class _TwoSites(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.norm1, self.norm2 = _FlagNorm(False), _FlagNorm(True)

    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.proj(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm2(hidden_states)
        return residual + hidden_states


def test_norms_of_one_class_keep_each_its_own_rule(monkeypatch):
    block = _TwoSites()
    report, fused, actual, expected = _patched_and_original(block, _inputs(), monkeypatch)
    assert fused == 2
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_norm_set_in_place_of_the_probed_one_is_called_as_a_module(monkeypatch):
    """A subclass that inherits the forward and changes what it calls (or any other norm set
    in the probed one's place) is not taken for the norm the probe saw."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    class Centred(GemmaRMSNorm):
        def _norm(self, x):
            return super()._norm(x - x.mean(-1, keepdim=True))

    block = _Block(GemmaRMSNorm(HIDDEN, eps=1e-6))
    kiln.patch(block)
    replacement = Centred(HIDDEN, eps=1e-6)
    replacement.load_state_dict(block.post_attention_layernorm.state_dict())
    block.post_attention_layernorm = replacement
    counts = _count(monkeypatch)
    with torch.no_grad():
        actual = block(*_inputs())
        kiln.unpatch(block)
        expected = block(*_inputs())
    assert counts["fused_add_rms_norm"] == 0
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_class_changed_after_the_patch_runs_its_forward(monkeypatch):
    """FSDP2's fully_shard swaps a module's class for a subclass of its own (whose forward
    transformers wraps again for checkpointing): the patched layer then runs that class's
    forward, and unpatch leaves it to the class."""
    block = _Block()
    kiln.patch(block)
    calls = []

    def forward(self, *args):
        calls.append(type(self).__name__)
        return _Block.forward(self, *args)

    block.__class__ = type("Sharded_Block", (_Block,), {"forward": forward})
    counts = _count(monkeypatch)
    with torch.no_grad():
        block(*_inputs())
    assert calls == ["Sharded_Block"] and counts["fused_add_rms_norm"] == 0
    kiln.unpatch(block)
    assert "forward" not in block.__dict__
    with torch.no_grad():
        block(*_inputs())
    assert calls == ["Sharded_Block"] * 2


def test_forward_mode_ad_runs_the_original(monkeypatch):
    block = _Block()
    inputs, tangents = _inputs(), _inputs(seed=1)
    expected = torch.func.jvp(block, inputs, tangents)
    kiln.patch(block)
    counts = _count(monkeypatch)
    actual = torch.func.jvp(block, inputs, tangents)
    assert counts["fused_add_rms_norm"] == 0
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_inference_tensors_run_without_seams(monkeypatch):
    """An inference tensor keeps no version counter, so a change to the sum between layers
    could not be seen: each layer normalises its own input."""
    model = _Stack()
    x = _inputs()[0]
    with torch.inference_mode():
        expected = model(x)
        kiln.patch(model)
        counts = _count_ops(monkeypatch)
        actual = model(x)
    assert counts == {"fused_add_rms_norm": 3, "rms_norm": 3}
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_patching_other_models_does_not_recompile_a_compiled_one():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = _Stack()
    kiln.patch(model)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    x = _inputs()[0]
    with torch.no_grad():
        compiled(x)
        for _ in range(3):
            kiln.patch(_Stack())
            compiled(x)
    assert counter.frame_count == 1


def test_a_global_rebound_since_is_seen_after_the_next_patch(tmp_path, monkeypatch):
    import importlib

    (tmp_path / "layer_with_a_global.py").write_text('''
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm


def act(x):
    return torch.relu(x)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(48, 48)
        self.post_attention_layernorm = LlamaRMSNorm(48)

    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.proj(act(hidden_states))
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("layer_with_a_global")
    first, second = module.Layer(), module.Layer()
    kiln.patch(first)
    monkeypatch.setattr(module, "act", torch.nn.functional.gelu)
    second.load_state_dict(first.state_dict())
    kiln.patch(second)
    inputs = _inputs()
    with torch.no_grad():
        patched = first(*inputs), second(*inputs)
        kiln.unpatch(first)
        expected = first(*inputs)
    for actual in patched:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)

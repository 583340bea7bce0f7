"""transformers' attentions that RMS-normalise each head of q and k right before their RoPE
(Qwen3, Qwen3-MoE, Qwen3-VL's text model, Gemma 3, and with a partial rotation Qwen3-Next and
Qwen3.5, and others written the same way):

    query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    ...
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

The norms and the rotation are three passes over q and k (a dozen kernels in eager); one
``kiln.head_norm_rope`` does all of it. The forward is the class's own source, recompiled with
two edits: each norm call gives its argument through unchanged, and the rotation becomes a
call that receives the two norm modules (and whether each result was transposed). That call
runs ``head_norm_rope`` where it computes what the norms and the rotation compute, and
otherwise calls the norm modules (hooks, patches and all) on q and k as they were before the
transpose, then the rotation.

The edit is made only where the syntax shows the norms' results reach the rotation and nothing
else: each norm call is the whole value of one statement in the forward's body, at most
followed by ``.transpose(1, 2)``, binding one name; the rotation rebinds both names from them
and reads them in no other argument; no statement between a norm and the rotation reads that
name or may change a tensor in place; the forward has no closure, no ``locals()``, no private
names, and its source still compiles to the code that runs. Anything else (a norm across all
heads, as OLMo 2's, a norm in a branch, a forward without source) keeps the forward as
:mod:`.rope_attention` patches it.
"""

import ast
import contextlib
import types
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from .. import rope_ops
from . import detect, forwards, probed, replace, rope_attention, source_rewrite
from .forwards import kiln_can_take, norm_eps
from .rope_attention import ROPE_GLOBAL, _parameters, _rope_call, rope_layout, rotate_half_rope

FUSED_GLOBAL = "_kiln_head_norms_and_rotary_pos_emb"
NORMS = ("q_norm", "k_norm")

WEIGHT_AS_IS, WEIGHT_PLUS_ONE = probed.WEIGHT_AS_IS, probed.WEIGHT_PLUS_ONE


def _is_rope_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == ROPE_GLOBAL


def _swaps_heads_and_positions(node: ast.AST) -> Optional[ast.AST]:
    """The tensor a ``X.transpose(1, 2)`` (or ``(2, 1)``) transposes, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "transpose"
            and not node.keywords and len(node.args) == 2):
        return None
    dims = [a.value for a in node.args if isinstance(a, ast.Constant)]
    return node.func.value if sorted(d for d in dims if isinstance(d, int)) == [1, 2] else None


@dataclass(frozen=True)
class _Site:
    """Where the norms and the rotation are: the names the norms' results are bound to, and
    whether each result is transposed (``.transpose(1, 2)``) before it is bound."""
    names: Tuple[str, str]
    transposed: Tuple[bool, bool]


def _find_site(fn: ast.FunctionDef) -> Optional[_Site]:
    """The norms and rotation of the module's docstring, checked on the syntax: each norm call
    is the whole value of a statement of the body binding one name (at most transposed first);
    the rotation rebinds both names from them and reads them nowhere else; no statement
    between a norm and the rotation reads that name or may change a tensor in place."""
    self_name = fn.args.args[0].arg
    calls = {attr: [n for n in ast.walk(fn) if source_rewrite.is_self_call(n, self_name, attr)] for attr in NORMS}
    ropes = [n for n in ast.walk(fn) if _is_rope_call(n)]
    if any(len(found) != 1 for found in calls.values()) or len(ropes) != 1:
        return None
    rope = ropes[0]
    if len(rope.args) < 4 or not all(isinstance(a, ast.Name) for a in rope.args[:2]):
        return None
    names = (rope.args[0].id, rope.args[1].id)
    rope_at = [i for i, s in enumerate(fn.body) if isinstance(s, ast.Assign) and s.value is rope]
    if len(rope_at) != 1 or names[0] == names[1]:
        return None
    rope_statement = fn.body[rope_at[0]]
    target = rope_statement.targets[0] if len(rope_statement.targets) == 1 else None
    if not (isinstance(target, ast.Tuple) and [getattr(e, "id", None) for e in target.elts] == list(names)):
        return None
    others = rope.args[2:] + [k.value for k in rope.keywords]
    if any(set(names) & source_rewrite.names_in(node) for node in others):
        return None
    transposed = []
    for attr, name in zip(NORMS, names):
        call = calls[attr][0]
        at = [i for i, s in enumerate(fn.body) if isinstance(s, ast.Assign) and len(s.targets) == 1
              and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name
              and (s.value is call or _swaps_heads_and_positions(s.value) is call)]
        if len(at) != 1 or at[0] >= rope_at[0]:
            return None
        between = fn.body[at[0] + 1:rope_at[0]]
        if any(name in source_rewrite.names_in(s) or source_rewrite.writes_in_place(s) for s in between):
            return None
        transposed.append(fn.body[at[0]].value is not call)
    return _Site(names, tuple(transposed))


class _Rewrite(ast.NodeTransformer):
    """Each norm call becomes its argument; the rotation takes the two norm modules and
    whether each result was transposed first."""

    def __init__(self, self_name: str, site: _Site):
        self.self_name, self.site = self_name, site

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if any(source_rewrite.is_self_call(node, self.self_name, attr) for attr in NORMS):
            return node.args[0]
        if _is_rope_call(node):
            modules = [ast.Attribute(value=ast.Name(id=self.self_name, ctx=ast.Load()), attr=attr, ctx=ast.Load())
                       for attr in NORMS]
            flags = [ast.Constant(value=t) for t in self.site.transposed]
            return ast.Call(func=ast.Name(id=FUSED_GLOBAL, ctx=ast.Load()), args=modules + flags + node.args,
                            keywords=node.keywords)
        return node


def rewritten_code(function: types.FunctionType) -> Optional[types.CodeType]:
    """The code of ``function`` with its norms handed to the rotation, or None where the
    forward is not written as the module's docstring describes, has no source, or its source
    no longer compiles to the code that runs (a file changed since it was imported)."""
    parsed = source_rewrite.parsed_forward(function)
    if parsed is None:
        return None
    tree, fn = parsed
    site = _find_site(fn)
    if site is None:
        return None

    def edit(fn: ast.FunctionDef) -> None:
        fn.body = [_Rewrite(fn.args.args[0].arg, site).visit(s) for s in fn.body]

    return source_rewrite.recompiled(function, tree, fn, edit)


def head_norm_rotate_half_rope(original: Callable, rule: str, form: str = "full") -> Callable:
    """The rotation the rewritten forward calls: ``(q_norm, k_norm, q_transposed,
    k_transposed, q, k, cos, sin, ...)``, one ``kiln.head_norm_rope`` where it computes what the
    norms and then ``original`` compute (the norms the patch probed, running as probed,
    weighed by ``rule``, of one eps; a table of ``form`` and a layout ``kiln.rope`` takes; no
    graph to record), else those calls, each norm on its result's layout before the transpose
    the forward applied after it (so hooks see what they saw, and a transpose that moved the
    last dimension is undone). ``form``: "full", or "partial" where ``original`` rotates the
    first columns of each head given a narrower table (Qwen3-Next's and Qwen3.5's
    ``partial_rotary_factor``): kiln.head_norm_rope then rotates the table's width, and the
    columns past it come out normalised, as the norms and the rotation leave them."""
    rotate = rotate_half_rope(original, form)
    names = _parameters(original)
    positional_ok = names[4:5] == ["unsqueeze_dim"]
    keyword_ok = "unsqueeze_dim" in names

    def fused_arguments(q_norm, k_norm, q, k, cos, sin, args, kwargs):
        call = _rope_call((q, k, cos, sin) + args, kwargs, positional_ok, keyword_ok)
        if call is None or probed.rule_of(q_norm) != rule or probed.rule_of(k_norm) != rule:
            return None
        layout = rope_layout(*call, form)
        if layout is None or not kiln_can_take(q, k, cos, sin):
            return None
        q_ok, q_weight = probed.fused_weight(q_norm, rule, q, differentiable=False)
        k_ok, k_weight = probed.fused_weight(k_norm, rule, q, differentiable=False)
        eps = norm_eps(q_norm, q)
        if not (q_ok and k_ok) or eps != norm_eps(k_norm, q):
            return None
        return layout, q_weight, k_weight, eps

    def apply_head_norms_and_rotary_pos_emb(q_norm, k_norm, q_transposed, k_transposed, q, k, cos, sin,
                                            *args, **kwargs):
        fused = fused_arguments(q_norm, k_norm, q, k, cos, sin, args, kwargs)
        if fused is None:
            return rotate(_normed(q_norm, q, q_transposed), _normed(k_norm, k, k_transposed), cos, sin,
                          *args, **kwargs)
        layout, q_weight, k_weight, eps = fused
        return rope_ops.head_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, layout=layout)

    apply_head_norms_and_rotary_pos_emb.__wrapped__ = original
    return apply_head_norms_and_rotary_pos_emb


def _normed(norm: torch.nn.Module, x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return norm(x.transpose(1, 2)).transpose(1, 2) if transposed else norm(x)


# One kiln copy per (class forward, weight rule, norm class forwards), shared by every
# patched attention of that class.
_FUSED_COPIES: "weakref.WeakKeyDictionary[types.FunctionType, dict]" = weakref.WeakKeyDictionary()


def with_head_norm_rope(function: types.FunctionType, rule: str, form: str = "full") -> Optional[types.FunctionType]:
    """The forward with its norms and rotation as :func:`head_norm_rotate_half_rope`, or None
    where its source is not written so. Like :func:`.rope_attention.with_kiln_rope`'s copy it
    reads a snapshot of its module's globals, brought up to date at each call."""
    copies = _FUSED_COPIES.setdefault(function, {})

    def make():
        code = rewritten_code(function)
        if code is None:
            return None
        scope = source_rewrite.module_scope(function, f"head-norms-{len(copies)}")
        rope = function.__globals__[ROPE_GLOBAL]
        own = {ROPE_GLOBAL: rotate_half_rope(rope, form), FUSED_GLOBAL: head_norm_rotate_half_rope(rope, rule, form)}
        return source_rewrite.function_from(code, scope, function), scope, function, own

    return source_rewrite.kept(copies, (rule, form), make)


def _norm_rule(module: torch.nn.Module) -> Optional[str]:
    """How both of the attention's head norms enter head_norm_rope, or None where they are
    not RMSNorms of one rule kiln computes (as :func:`.detect.classify_norm` tells them apart)."""
    rules = set()
    for attr in NORMS:
        norm = getattr(module, attr, None)
        if not isinstance(norm, torch.nn.Module) or not detect.norm_candidate(norm):
            return None
        result = detect.classify_norm(norm, replace.original_forward(norm))
        rule = probed.rule_of_match(result)
        if rule is None:
            return None
        rules.add(rule)
    return rules.pop() if len(rules) == 1 else None


def _probe_disagrees(module: torch.nn.Module, rule: str, original_rope: Callable,
                     form: str = "full") -> Optional[str]:
    """None when ``kiln.head_norm_rope`` with the attention's norms' weights entered by
    ``rule`` computes what the norms' own forwards (not their hooks) and then ``original_rope``
    compute on random probes (fp32 and bf16, random norm weights of the probe's dtype, tables
    of ``form``); else why not."""
    norms = [getattr(module, attr) for attr in NORMS]
    weights = [getattr(n, "weight", None) for n in norms]
    dim = weights[0].shape[0] if isinstance(weights[0], torch.Tensor) else getattr(module, "head_dim", None)
    if not isinstance(dim, int) or dim % 2:
        return f"its head dim {dim!r} is not even"
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, cos, sin = rope_attention.probe(dtype, g, form, dim=dim)
        swaps = [detect._Swapped(n, params={"weight": 0.3 * torch.randn(dim, generator=g).to(dtype)})
                 for n, w in zip(norms, weights) if isinstance(w, torch.Tensor)]
        with torch.no_grad(), contextlib.ExitStack() as stack:
            for norm in norms:  # 1 + weight made of a probe's weight is not kept
                stack.callback(norm.__dict__.pop, forwards.KEPT_WEIGHT, None)
            for swap in swaps:
                stack.enter_context(swap)
            try:
                expected = original_rope(replace.original_forward(norms[0])(q),
                                         replace.original_forward(norms[1])(k), cos, sin)
                (q_ok, q_weight), (k_ok, k_weight) = (probed.fused_weight(n, rule, q, differentiable=False) for n in norms)
                if not (q_ok and k_ok):
                    return f"its norms' weights do not fit kiln.head_norm_rope on a {dtype} probe"
                actual = rope_ops.head_norm_rope(q, k, q_weight, k_weight, cos, sin, norm_eps(norms[0], q))
            except Exception as e:
                return f"a {dtype} probe fails ({type(e).__name__}: {e})"
        for e, a in zip(expected, actual):
            why = detect._agree(e, a)
            if why is not None:
                return f"on a {dtype} probe kiln.head_norm_rope {why}"
    return None


# The rope matches whose table forms head_norm_rope takes: transformers' usual table, and one
# narrower than the head rotating its first columns (the function rotates both).
_FORMS = {rope_attention.factory: "full", rope_attention.partial_factory: "partial"}


def fuse(module: torch.nn.Module, match: detect.Match) -> detect.Match:
    """``match`` (transformers' rotate_half RoPE in the attention's forward, as
    :func:`.rope_attention.classify` found it) with the per-head q/k RMSNorms folded into the
    rotation where the forward is written for it and a probe agrees; else ``match`` itself."""
    form = _FORMS.get(match.factory)
    if form is None:
        return match
    rule = _norm_rule(module)
    if rule is None:
        return match
    function = type(module).forward
    copy = with_head_norm_rope(function, rule, form)
    if copy is None:
        return match
    rope = function.__globals__[ROPE_GLOBAL]
    keys = [detect.forward_key(norm, replace.original_forward(norm)) for norm in (module.q_norm, module.k_norm)]
    head_dim = getattr(module, "head_dim", None)
    key = ("head_norm_rope", rule, form, rope, *keys, head_dim) if all(keys) and isinstance(head_dim, int) else None
    if detect.remembered(key, lambda: _probe_disagrees(module, rule, rope, form)) is not None:
        return match

    # Marked here, not in the factory, which also makes a deep copy's forward before the copy
    # has its attributes (the copy's norms carry the marks over).
    for norm in (module.q_norm, module.k_norm):
        probed.remember(norm, rule)

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        return copy.__get__(module)

    kind = {"full": "per-head q/k rms_norm + rope (in the attention's forward)",
            "partial": "per-head q/k rms_norm + rope (the first rotary_dim columns, in the attention's forward)"}[form]
    return detect.Match(kind, "head_norm_rope", factory, family="rope")

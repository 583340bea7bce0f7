"""transformers' decoder layers that add a block's output to the residual stream and
RMS-normalise the sum in three statements (Llama, Mistral, Qwen2/3, Gemma, DeepSeek, GLM and
a hundred more, all written from one template):

    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

The add and the norm are two passes over the stream (the sum written, then read back); one
``kiln.fused_add_rms_norm`` reads both addends once and writes the sum and the normalised
row, as vLLM's layers do. The forward is the class's own source, recompiled with those three
statements as one: ``hidden_states, residual = <kiln's call>(self.post_attention_layernorm,
residual, hidden_states)``. That call runs ``fused_add_rms_norm`` where it computes what the
add and the norm module compute, and otherwise the add and the module itself (hooks, patches
and all).

The edit is made only where the three statements are written so (one after the other, in any
block of the forward: the sum bound to one of its two names, the other name rebound to it, the
norm module called on it alone and rebinding it), the forward passes
:func:`.source_rewrite.parsed_forward`'s checks, and the norm module is an RMSNorm whose
forward (Llama's rule, Gemma's ``1 + weight``, ``nn.RMSNorm``, diffusers') a probe of
``fused_add_rms_norm`` agrees with. A LayerNorm after the add (CLIP's, Whisper's) is left as
it is: kiln has no fused add for it.
"""

import ast
import contextlib
import types
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from .. import norm_ops
from . import detect, forwards, replace, source_rewrite
from .forwards import _offset_weight, kiln_can_take, norm_eps

FUSED_GLOBAL = "_kiln_residual_add_and_rms_norm"

# How the norm's weight enters fused_add_rms_norm: as it is, or as 1 + weight (Gemma's).
WEIGHT_AS_IS = "weight"
WEIGHT_PLUS_ONE = "1 + weight"

KIND = "residual add + rms_norm (in the layer's forward)"


def candidate(module: torch.nn.Module) -> bool:
    """A module with a norm among its children whose class's forward is written with an
    add-then-norm triple of one of them (what the triple's norm computes is :func:`classify`'s
    to find)."""
    children = {name for name, child in module.named_children() if detect.norm_candidate(child)}
    return bool(children) and bool(children & _site_norms(type(module).forward))


# The norms a class forward has add-then-norm triples for, found once per forward.
_SITE_NORMS: "weakref.WeakKeyDictionary[types.FunctionType, frozenset]" = weakref.WeakKeyDictionary()


def _site_norms(function) -> frozenset:
    if not isinstance(function, types.FunctionType):
        return frozenset()
    if function not in _SITE_NORMS:
        parts = source_rewrite.editable(function)
        parsed = source_rewrite.parsed_forward(parts[0]) if parts is not None else None
        _SITE_NORMS[function] = frozenset(find_sites(parsed[1])) if parsed is not None else frozenset()
    return _SITE_NORMS[function]


@dataclass(frozen=True)
class _Site:
    """Three statements to fuse: ``total = left + right``, ``other = total``,
    ``total = self.<norm>(total)``."""
    statements: list  # the statement list holding them
    at: int  # the first one's index there
    norm: str
    left: str
    right: str
    total: str
    other: str


def _name(node: ast.AST) -> Optional[str]:
    return node.id if isinstance(node, ast.Name) else None


def _assigned(statement: ast.stmt) -> Optional[Tuple[str, ast.AST]]:
    """(name, value) for ``name = value``, else None."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = _name(statement.targets[0])
        if target is not None:
            return target, statement.value
    return None


def _site_at(statements: list, i: int, self_name: str) -> Optional[_Site]:
    first, second, third = (_assigned(s) for s in statements[i:i + 3])
    if first is None or second is None or third is None:
        return None
    total, value = first
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    left, right = _name(value.left), _name(value.right)
    if left is None or right is None or left == right or total not in (left, right):
        return None
    other = right if total == left else left
    if second[0] != other or _name(second[1]) != total:
        return None
    name, call = third
    if name != total or not source_rewrite.is_self_call(call, self_name) or _name(call.args[0]) != total:
        return None
    return _Site(statements, i, call.func.attr, left, right, total, other)


def _statement_lists(fn: ast.FunctionDef):
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                yield statements


def find_sites(fn: ast.FunctionDef) -> Dict[str, list]:
    """The forward's add-then-norm statement triples, by the norm's attribute name."""
    self_name = fn.args.args[0].arg
    sites: Dict[str, list] = {}
    for statements in _statement_lists(fn):
        i = 0
        while i + 2 < len(statements):
            site = _site_at(statements, i, self_name)
            if site is None:
                i += 1
                continue
            sites.setdefault(site.norm, []).append(site)
            i += 3
    return sites


def _fused_statement(site: _Site, self_name: str) -> ast.stmt:
    norm = ast.Attribute(value=ast.Name(id=self_name, ctx=ast.Load()), attr=site.norm, ctx=ast.Load())
    call = ast.Call(func=ast.Name(id=FUSED_GLOBAL, ctx=ast.Load()),
                    args=[norm, ast.Name(id=site.left, ctx=ast.Load()), ast.Name(id=site.right, ctx=ast.Load())],
                    keywords=[])
    target = ast.Tuple(elts=[ast.Name(id=site.total, ctx=ast.Store()), ast.Name(id=site.other, ctx=ast.Store())],
                       ctx=ast.Store())
    return ast.copy_location(ast.Assign(targets=[target], value=call), site.statements[site.at])


def rewritten_code(function: types.FunctionType, norms: frozenset) -> Optional[types.CodeType]:
    """The code of ``function`` with each add-then-norm triple of a norm named in ``norms``
    as one call of the fused global, or None where there is none, or the forward fails
    :func:`.source_rewrite.parsed_forward`'s checks or no longer matches its source."""
    parsed = source_rewrite.parsed_forward(function)
    if parsed is None:
        return None
    tree, fn = parsed
    sites = [s for name, found in find_sites(fn).items() if name in norms for s in found]
    if not sites:
        return None
    self_name = fn.args.args[0].arg

    def edit(fn: ast.FunctionDef) -> None:
        # From the last, so that an earlier index is not moved by a later edit of its list.
        for site in sorted(sites, key=lambda s: s.at, reverse=True):
            site.statements[site.at:site.at + 3] = [_fused_statement(site, self_name)]

    return source_rewrite.recompiled(function, tree, fn, edit)


def _fused_weight(norm: torch.nn.Module, rule: str, like: torch.Tensor):
    """(True, the weight fused_add_rms_norm takes, or None) for a norm of ``like``'s rows, or
    (False, None) where fused_add_rms_norm would not compute what the norm does."""
    weight = getattr(norm, "weight", None)
    if weight is None:
        return rule == WEIGHT_AS_IS, None
    if not isinstance(weight, torch.Tensor) or weight.shape != (like.shape[-1],) or weight.device != like.device:
        return False, None
    if rule == WEIGHT_PLUS_ONE:
        if torch.is_grad_enabled() and weight.requires_grad:  # in the graph, so the weight gets its gradient
            return True, (1.0 + weight.float()).to(like.dtype)
        return True, _offset_weight(norm, like.dtype)
    return weight.dtype == like.dtype, weight


def residual_add_and_rms_norm(rules: Dict[Callable, str]) -> Callable:
    """The call the rewritten forward makes: ``(norm, left, right) -> (norm(left + right),
    left + right)``, as one ``kiln.fused_add_rms_norm`` where the norm's class forward is one
    of ``rules`` (weighed by its rule), unwrapped, and the addends are tensors of one shape,
    dtype and device kiln takes; else the add and the module."""

    def fused(norm, left, right):
        if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)) or left.shape != right.shape:
            return None
        rule = rules.get(type(norm).forward)
        if rule is None or not replace.runs_as_classified(norm, type(norm).forward):
            return None
        if left.dim() == 0 or not kiln_can_take(left, right, differentiable=True):
            return None
        ok, weight = _fused_weight(norm, rule, left)
        if not ok:
            return None
        return norm_ops.fused_add_rms_norm(left, right, weight, norm_eps(norm, left))

    def residual_add_and_norm(norm, left, right):
        out = fused(norm, left, right)
        if out is None:
            total = left + right
            return norm(total), total
        return out

    return residual_add_and_norm


# One kiln copy per (class forward, fused norms and their rules), shared by every layer of
# that class.
_COPIES: "weakref.WeakKeyDictionary[types.FunctionType, dict]" = weakref.WeakKeyDictionary()


def with_fused_residual_norms(function: types.FunctionType,
                              norms: Dict[str, Tuple[Callable, str]]) -> Optional[types.FunctionType]:
    """The forward with the add-then-norm triples of ``norms`` (attribute name -> the norm's
    class forward and rule) as :func:`residual_add_and_rms_norm`, or None where its source
    is not written so."""
    copies = _COPIES.setdefault(function, {})
    key = frozenset(norms.items())
    if key not in copies:
        parts = source_rewrite.editable(function)
        code = rewritten_code(parts[0], frozenset(norms)) if parts is not None else None
        copy = None
        if code is not None:
            inner, around = parts
            scope = source_rewrite.module_scope(inner, f"residual-norms-{len(copies)}")
            scope[FUSED_GLOBAL] = residual_add_and_rms_norm(dict(norms.values()))
            copy = around(source_rewrite.function_from(code, scope, inner))
        copies[key] = copy
    return copies[key]


def _rule(norm: torch.nn.Module) -> Optional[str]:
    result = detect.classify_norm(norm, replace.original_forward(norm))
    if isinstance(result, detect.NoMatch) or result.op != "rms_norm":
        return None
    return WEIGHT_PLUS_ONE if result.factory is forwards.rms_norm_offset else WEIGHT_AS_IS


def probe_disagrees(norm: torch.nn.Module, rule: str) -> Optional[str]:
    """None when ``kiln.fused_add_rms_norm`` with the norm's weight entered by ``rule``
    computes what the add and the norm's own forward (not its hooks) compute on random probes
    (fp32, bf16 and fp16, a random weight of the norm's dtype); else why not."""
    weight = getattr(norm, "weight", None)
    shape = detect._normalized_shape(norm)
    hidden = weight.shape[0] if isinstance(weight, torch.Tensor) else shape[-1] if shape else 64
    g = torch.Generator().manual_seed(0)
    original = replace.original_forward(norm)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        left, right = (torch.randn(3, 5, hidden, generator=g).to(dtype) for _ in range(2))
        swap = {} if weight is None else {"weight": (1.0 + 0.3 * torch.randn(hidden, generator=g)).to(dtype)}
        with torch.no_grad(), detect._Swapped(norm, params=swap), contextlib.ExitStack() as stack:
            stack.callback(norm.__dict__.pop, forwards.OFFSET_CACHE, None)  # not a probe's 1 + weight
            try:
                total = left + right
                expected = original(total)
                ok, fused_weight = _fused_weight(norm, rule, left)
                if not ok:
                    return f"its weight does not fit kiln.fused_add_rms_norm on a {dtype} probe"
                actual = norm_ops.fused_add_rms_norm(left, right, fused_weight, norm_eps(norm, left))
            except Exception as e:
                return f"a {dtype} probe fails ({type(e).__name__}: {e})"
        for e, a in ((expected, actual[0]), (total, actual[1])):
            why = detect._agree(e, a)
            if why is not None:
                return f"on a {dtype} probe kiln.fused_add_rms_norm {why}"
    return None


def classify(module: torch.nn.Module, original: Callable):
    """A Match whose forward fuses the layer's add-then-norm triples, or a NoMatch saying why
    not."""
    function = type(module).forward
    if getattr(original, "__func__", None) is not function:
        return detect.NoMatch("layer", "its forward is not its class's own")
    sites = _site_norms(function)
    norms, reasons = {}, []
    for name in sorted(sites):
        norm = getattr(module, name, None)
        if not isinstance(norm, torch.nn.Module) or not detect.norm_candidate(norm):
            reasons.append(f"{name} is not a norm")
            continue
        rule = _rule(norm)
        key = detect.forward_key(norm, replace.original_forward(norm))
        why = "it is not an RMSNorm" if rule is None else detect.remembered(
            key and ("fused_add_rms_norm", rule, key), lambda: probe_disagrees(norm, rule))
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        norms[name] = (type(norm).forward, rule)
    copy = with_fused_residual_norms(function, norms) if norms else None
    if copy is None:
        return detect.NoMatch("layer", "; ".join(reasons) or "its forward no longer matches its source")

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        return copy.__get__(module)

    return detect.Match(KIND, "fused_add_rms_norm", factory, family="rms_norm")

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
block of the forward: the sum of the residual's name and any expression, such as Phi-3's
``residual + self.resid_attn_dropout(hidden_states)``, bound to a name, the residual's name
rebound to it, the norm module called on it alone and rebinding it), the forward passes
:func:`.source_rewrite.parsed_forward`'s checks, and the norm module is an RMSNorm whose
forward (Llama's rule, Gemma's ``1 + weight``, ``nn.RMSNorm``, diffusers') a probe of
``fused_add_rms_norm`` agrees with. A LayerNorm after the add (CLIP's, Whisper's) is left as
it is: kiln has no fused add for it.

Where the forward also starts by normalising its input (``residual = hidden_states``,
``hidden_states = self.input_layernorm(hidden_states)``, its first two statements) and ends by
returning its last residual add, consecutive layers of a model hand the next layer's first norm
over the seam between them (:mod:`.residual_norm_chain`): the add and that norm in one
``fused_add_rms_norm`` too.
"""

import ast
import contextlib
import types
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from .. import norm_ops
from . import detect, forwards, probed, replace, residual_norm_chain, source_rewrite
from .forwards import kiln_can_take, norm_eps
from .probed import rule_of

FUSED_GLOBAL = "_kiln_residual_add_and_rms_norm"
ENTRY_GLOBAL = "_kiln_first_rms_norm"
EXIT_GLOBAL = "_kiln_last_residual_add"


KIND = "residual add + rms_norm (in the layer's forward)"


def candidate(module: torch.nn.Module) -> bool:
    """A module whose class's forward is written with an add-then-norm triple (or starts with a
    norm and ends with an add) of a child that is an RMSNorm."""
    sites = _sites_of(type(module).forward)
    names = sites.triples | ({sites.entry} if sites.entry is not None and sites.exit else set())
    for name in names:
        norm = getattr(module, name, None)
        if isinstance(norm, torch.nn.Module) and detect.norm_candidate(norm) and _rule(norm) is not None:
            return True
    return False


@dataclass(frozen=True)
class Sites:
    """What a forward is written with: the norms of its add-then-norm triples, the norm its
    body starts with (as the seam's receiving end), and whether it ends with a residual add it
    returns (the seam's giving end)."""
    triples: frozenset = frozenset()
    entry: Optional[str] = None
    exit: bool = False


# Found once per class forward.
_SITES: "weakref.WeakKeyDictionary[types.FunctionType, Sites]" = weakref.WeakKeyDictionary()


def _sites_of(function) -> Sites:
    if not isinstance(function, types.FunctionType):
        return Sites()
    if function not in _SITES:
        parts = source_rewrite.editable(function)
        parsed = source_rewrite.parsed_forward(parts[0]) if parts is not None else None
        if parsed is None:
            _SITES[function] = Sites()
        else:
            fn = parsed[1]
            entry = _entry_site(fn)
            _SITES[function] = Sites(frozenset(find_sites(fn)), entry and entry[2], _exit_site(fn) is not None)
    return _SITES[function]


@dataclass(frozen=True)
class _Site:
    """Three statements to fuse: ``total = left + right``, ``other = total``,
    ``total = self.<norm>(total)``, where one addend is the name ``other`` and the other is any
    expression (the block's output, or Phi-3's ``self.resid_attn_dropout(hidden_states)``)."""
    statements: list  # the statement list holding them
    at: int  # the first one's index there
    norm: str
    left: ast.expr
    right: ast.expr
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
    # The fused call binds (total, other) to (norm(sum), sum), as the three statements do,
    # and evaluates the addends in their order: any expression but the residual's name.
    other = second[0]
    if other == total or _name(second[1]) != total or other not in (_name(value.left), _name(value.right)):
        return None
    name, call = third
    if name != total or not source_rewrite.is_self_call(call, self_name) or _name(call.args[0]) != total:
        return None
    return _Site(statements, i, call.func.attr, value.left, value.right, total, other)


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
    call = ast.Call(func=ast.Name(id=FUSED_GLOBAL, ctx=ast.Load()), args=[norm, site.left, site.right], keywords=[])
    target = ast.Tuple(elts=[ast.Name(id=site.total, ctx=ast.Store()), ast.Name(id=site.other, ctx=ast.Store())],
                       ctx=ast.Store())
    return ast.copy_location(ast.Assign(targets=[target], value=call), site.statements[site.at])


def _first_statement(fn: ast.FunctionDef) -> int:
    """Where the body starts, past a docstring."""
    first = fn.body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return 1 if is_doc else 0


def _entry_site(fn: ast.FunctionDef) -> Optional[Tuple[str, str, str]]:
    """(residual, hidden, norm) where the body starts ``residual = hidden`` and
    ``hidden = self.<norm>(hidden)``, else None."""
    at = _first_statement(fn)
    pair = [_assigned(s) for s in fn.body[at:at + 2]]
    if len(pair) != 2 or None in pair:
        return None
    (residual, value), (hidden, call) = pair
    if _name(value) != hidden or residual == hidden:
        return None
    if not source_rewrite.is_self_call(call, fn.args.args[0].arg) or _name(call.args[0]) != hidden:
        return None
    return residual, hidden, call.func.attr


def _exit_site(fn: ast.FunctionDef) -> Optional[Tuple[str, ast.expr, ast.expr]]:
    """(total, left, right) where the body ends ``total = left + right`` (each addend any
    expression) and ``return total``, else None."""
    if len(fn.body) < 2:
        return None
    last = fn.body[-1]
    add = _assigned(fn.body[-2])
    if not (isinstance(last, ast.Return) and add is not None and isinstance(add[1], ast.BinOp)
            and isinstance(add[1].op, ast.Add)):
        return None
    total = add[0]
    if _name(last.value) != total:
        return None
    return total, add[1].left, add[1].right


def _call(function: str, args: list) -> ast.Call:
    return ast.Call(func=ast.Name(id=function, ctx=ast.Load()), args=args, keywords=[])


def _load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def _store(*names: str) -> ast.expr:
    targets = [ast.Name(id=n, ctx=ast.Store()) for n in names]
    return targets[0] if len(targets) == 1 else ast.Tuple(elts=targets, ctx=ast.Store())


def rewritten_code(function: types.FunctionType, norms: frozenset, seam: bool = False) -> Optional[types.CodeType]:
    """The code of ``function`` with each add-then-norm triple of a norm named in ``norms``
    as one call of the fused global and, with ``seam``, its first norm and its last add as the
    seam's calls; or None where there is nothing to edit, or the forward fails
    :func:`.source_rewrite.parsed_forward`'s checks or no longer matches its source."""
    parsed = source_rewrite.parsed_forward(function)
    if parsed is None:
        return None
    tree, fn = parsed
    sites = [s for name, found in find_sites(fn).items() if name in norms for s in found]
    entry, exit_ = (_entry_site(fn), _exit_site(fn)) if seam else (None, None)
    if seam and (entry is None or exit_ is None):
        return None
    if not sites and not seam:
        return None
    self_name = fn.args.args[0].arg

    def edit(fn: ast.FunctionDef) -> None:
        if seam:
            total, left, right = exit_
            fn.body[-2] = ast.copy_location(
                ast.Assign(targets=[_store(total)], value=_call(EXIT_GLOBAL, [_load(self_name), left, right])),
                fn.body[-2])
        # From the last, so that an earlier index is not moved by a later edit of its list.
        for site in sorted(sites, key=lambda s: s.at, reverse=True):
            site.statements[site.at:site.at + 3] = [_fused_statement(site, self_name)]
        if seam:
            residual, hidden, norm = entry
            at = _first_statement(fn)
            norm_module = ast.Attribute(value=_load(self_name), attr=norm, ctx=ast.Load())
            fn.body[at:at + 2] = [ast.copy_location(
                ast.Assign(targets=[_store(residual, hidden)],
                           value=_call(ENTRY_GLOBAL, [_load(self_name), norm_module, _load(hidden)])), fn.body[at])]

    return source_rewrite.recompiled(function, tree, fn, edit)


def residual_add_and_rms_norm(norm, left, right):
    """The call the rewritten forward makes for an add-then-norm triple: ``(norm(left + right),
    left + right)``, as one ``kiln.fused_add_rms_norm`` where the norm is one a probe agreed
    with when its layer was patched, running as probed (weighed by its rule), and the addends
    are tensors of one shape, dtype and device kiln takes; else the add and the module."""
    rule = rule_of(norm)
    if rule is not None and isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor) \
            and left.shape == right.shape and left.dim() > 0 and kiln_can_take(left, right, differentiable=True):
        ok, weight = probed.fused_weight(norm, rule, left, differentiable=True)
        if ok:
            return norm_ops.fused_add_rms_norm(left, right, weight, norm_eps(norm, left))
    total = left + right
    return norm(total), total


def first_rms_norm(layer: torch.nn.Module, norm: torch.nn.Module, hidden):
    """The seam's receiving end: ``(hidden, norm(hidden))``, the norm's rows taken from the
    layer before where it handed them over for this very tensor."""
    handed = residual_norm_chain.take(layer, norm, hidden) if isinstance(hidden, torch.Tensor) else None
    return hidden, (norm(hidden) if handed is None else handed)


def last_residual_add(layer: torch.nn.Module, left, right):
    """The seam's giving end: ``left + right``, computed with the next layer's first norm of it
    in one ``kiln.fused_add_rms_norm`` where that layer may take it (:mod:`.residual_norm_chain`)
    and no graph is recorded."""
    found = residual_norm_chain.receiver(layer)
    if found is not None and isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor) \
            and left.shape == right.shape and left.dim() > 0 and not left.is_inference() \
            and kiln_can_take(left, right):
        nxt, norm, rule = found
        weight = getattr(norm, "weight", None)
        if not (torch.is_grad_enabled() and isinstance(weight, torch.Tensor) and weight.requires_grad):
            ok, fused_weight = probed.fused_weight(norm, rule, left, differentiable=True)
            if ok:
                normed, total = norm_ops.fused_add_rms_norm(left, right, fused_weight, norm_eps(norm, left))
                residual_norm_chain.hand_over(layer, nxt, norm, total, normed)
                return total
    return left + right


# One kiln copy per (class forward, fused norms, seam), shared by every layer of that class.
_COPIES: "weakref.WeakKeyDictionary[types.FunctionType, dict]" = weakref.WeakKeyDictionary()
_OWN_GLOBALS = {FUSED_GLOBAL: residual_add_and_rms_norm, ENTRY_GLOBAL: first_rms_norm, EXIT_GLOBAL: last_residual_add}


def with_fused_residual_norms(function: types.FunctionType, norms: frozenset,
                              seam: bool = False) -> Optional[types.FunctionType]:
    """The forward with the add-then-norm triples of the norms named in ``norms`` as
    :func:`residual_add_and_rms_norm` and, with ``seam``, its first norm and last add as
    :func:`first_rms_norm` and :func:`last_residual_add`; or None where its source is not
    written so. The copy's globals are brought up to date with its module's at each call."""
    copies = _COPIES.setdefault(function, {})

    def make():
        parts = source_rewrite.editable(function)
        code = rewritten_code(parts[0], norms, seam) if parts is not None else None
        if code is None:
            return None
        inner, around = parts
        scope = source_rewrite.module_scope(inner, f"residual-norms-{len(copies)}")
        return around(source_rewrite.function_from(code, scope, inner)), scope, inner, _OWN_GLOBALS

    return source_rewrite.kept(copies, (norms, seam), make)


def _rule(norm: torch.nn.Module) -> Optional[str]:
    return probed.rule_of_match(detect.classify_norm(norm, replace.original_forward(norm)))


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
            stack.callback(norm.__dict__.pop, forwards.KEPT_WEIGHT, None)  # not a probe's 1 + weight
            try:
                total = left + right
                expected = original(total)
                ok, fused_weight = probed.fused_weight(norm, rule, left, differentiable=True)
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


def _fusable_rule(module: torch.nn.Module, name: str) -> Tuple[Optional[str], Optional[str]]:
    """(the rule the named norm's weight enters fused_add_rms_norm by, None) where a probe
    agrees, else (None, why not)."""
    norm = getattr(module, name, None)
    if not isinstance(norm, torch.nn.Module) or not detect.norm_candidate(norm):
        return None, f"{name} is not a norm"
    rule = _rule(norm)
    if rule is None:
        return None, f"{name}: it is not an RMSNorm"
    key = detect.forward_key(norm, replace.original_forward(norm))
    why = detect.remembered(key and ("fused_add_rms_norm", rule, key), lambda: probe_disagrees(norm, rule))
    return (None, f"{name}: {why}") if why is not None else (rule, None)


def classify(module: torch.nn.Module, original: Callable):
    """A Match whose forward fuses the layer's add-then-norm triples (and its seams with the
    layers beside it), or a NoMatch saying why not."""
    function = type(module).forward
    if getattr(original, "__func__", None) is not function:
        return detect.NoMatch("layer", "its forward is not its class's own")
    sites = _sites_of(function)
    rules, reasons = {}, []
    for name in sorted(sites.triples):
        rule, why = _fusable_rule(module, name)
        if rule is None:
            reasons.append(why)
        else:
            rules[name] = rule
    entry = None
    if sites.entry is not None and sites.exit:
        rule, why = _fusable_rule(module, sites.entry)
        if rule is not None:
            entry = sites.entry
            rules.setdefault(sites.entry, rule)
    triples = frozenset(rules) & sites.triples
    copy = with_fused_residual_norms(function, triples, entry is not None) if triples or entry else None
    if copy is None:
        return detect.NoMatch("layer", "; ".join(reasons) or "its forward no longer matches its source")

    # Marked here, not in the factory, which also makes a deep copy's forward before the copy
    # has its attributes (the copy's norms carry the marks over).
    for name, rule in rules.items():
        probed.remember(getattr(module, name), rule)

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        residual_norm_chain.register(module, entry)
        return source_rewrite.bound_forward(copy, module, function)

    return detect.Match(KIND, "fused_add_rms_norm", factory, family="rms_norm")

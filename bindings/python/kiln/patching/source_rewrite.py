"""A module's forward recompiled from its own source with a few calls edited, for the patches
that fuse across statements of a forward (:mod:`.head_norm_attention`,
:mod:`.residual_norm_layer`).

The edit is made only on a forward whose source still compiles to the code that runs (compared
instruction by instruction, so a file changed since it was imported is left alone), that has
no closure, no decorator and nothing that reaches a value other than through its names (see
:func:`opaque`). The copy reads a snapshot of the original's module globals, held by a module of
its own in ``sys.modules``: torch.compile finds a function's globals again by its module's name.
"""

import ast
import dis
import inspect
import sys
import textwrap
import types
from typing import Callable, Optional, Tuple


def names_in(node: ast.AST) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def opaque(fn: ast.FunctionDef) -> bool:
    """Whether the forward could reach a value by another way than its names in its own
    statements (a closure, a scope's dictionary, a global declaration, an assignment inside an
    expression), or has a name a recompilation outside its class would not mangle."""
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                ast.Global, ast.Nonlocal, ast.NamedExpr)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("locals", "vars", "globals", "eval", "exec"):
            return True
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name.startswith("__") and not name.endswith("__"):
            return True
    return False


def writes_in_place(statement: ast.stmt) -> bool:
    """Whether a statement may change a tensor it does not bind: anything but ``names = value``,
    or a value that calls an in-place method (``x.mul_(...)``) or writes to ``out=``."""
    if not isinstance(statement, ast.Assign):
        return True
    for target in statement.targets:
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        if not all(isinstance(n, ast.Name) for n in names):
            return True
    for node in ast.walk(statement.value):
        if isinstance(node, ast.Call):
            if any(k.arg == "out" for k in node.keywords):
                return True
            if isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                    and not node.func.attr.endswith("__"):
                return True
    return False


def is_self_call(node: ast.AST, self_name: str, attr: Optional[str] = None) -> bool:
    """Whether ``node`` is ``self.<attr>(one positional argument)``, any attribute if None."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and (attr is None or node.func.attr == attr)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == self_name
            and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred))


def instructions(code: types.CodeType) -> list:
    """The code's instructions and their arguments, but for what the compiler decides from the
    module around the function (a method call on an imported name loads it as an attribute)
    and for jump offsets, which those decisions move."""
    shape = []
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":
            continue
        jump = ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs
        arg = None if jump or isinstance(ins.argval, types.CodeType) else ins.argval
        shape.append(("LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname, arg))
    return shape


def _function_code(module: types.CodeType, name: str) -> Optional[types.CodeType]:
    codes = [c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
    return codes[0] if len(codes) == 1 else None


def editable(function) -> Optional[Tuple[types.FunctionType, Callable]]:
    """(the function whose source is edited, a function that makes ``function`` again around
    an edited copy of it), or None. For most forwards that is the function itself; a forward
    that a wrapper replaced at class creation (transformers' gradient-checkpointing layers wrap
    their forward so) is edited inside, and the wrapper is copied with its one cell that held
    the original holding the copy, so it still does what it did around it."""
    if not isinstance(function, types.FunctionType):
        return None
    inner = getattr(function, "__wrapped__", None)
    if inner is None:
        return function, lambda copy: copy
    closure = function.__closure__ or ()
    holding = [i for i, cell in enumerate(closure) if _holds(cell, inner)]
    if not isinstance(inner, types.FunctionType) or len(holding) != 1:
        return None

    def around(copy: types.FunctionType) -> types.FunctionType:
        cells = tuple(types.CellType(copy) if i == holding[0] else cell for i, cell in enumerate(closure))
        wrapper = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                                     cells)
        wrapper.__kwdefaults__ = function.__kwdefaults__
        wrapper.__dict__.update(function.__dict__)
        wrapper.__qualname__, wrapper.__doc__, wrapper.__wrapped__ = function.__qualname__, function.__doc__, copy
        return wrapper

    return inner, around


def _holds(cell, value) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def parsed_forward(function: types.FunctionType,
                   wrapped: bool = False) -> Optional[Tuple[ast.Module, ast.FunctionDef]]:
    """The syntax tree of ``function``'s own source (the module around it, and its one
    function definition), or None where it has no source, is decorated, has a closure
    (``super()`` included: the recompiled code would lack its cells) or is opaque.
    ``wrapped``: ``function`` is the inner function of a wrapper :func:`editable` copies
    around the edited copy, so the decorators that made that wrapper are left out of the tree
    (the wrapper still runs them: diffusers' ``apply_lora_scale``)."""
    if not isinstance(function, types.FunctionType) or function.__code__.co_freevars:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    fn = tree.body[0]
    if wrapped:
        fn.decorator_list = []
    if fn.name != function.__name__ or fn.decorator_list or not fn.args.args or opaque(fn):
        return None
    return tree, fn


def recompiled(function: types.FunctionType, tree: ast.Module, fn: ast.FunctionDef,
               edit: Callable[[ast.FunctionDef], None]) -> Optional[types.CodeType]:
    """The code of ``fn`` (parsed from ``function`` by :func:`parsed_forward`) after ``edit``
    changed its body in place, or None where the unedited source no longer compiles to the
    code that runs."""
    # Defaults and annotations come from the original function object, not from evaluating
    # them again.
    for arg in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs + [fn.args.vararg, fn.args.kwarg]:
        if arg is not None:
            arg.annotation = None
    fn.returns, fn.args.defaults = None, []
    fn.args.kw_defaults = [None] * len(fn.args.kwonlyargs)
    ast.increment_lineno(tree, function.__code__.co_firstlineno - 1)
    as_read = _function_code(compile(tree, function.__code__.co_filename, "exec"), fn.name)
    if as_read is None or instructions(as_read) != instructions(function.__code__):
        return None
    edit(fn)
    ast.fix_missing_locations(tree)
    return _function_code(compile(tree, function.__code__.co_filename, "exec"), fn.name)


def module_scope(function: types.FunctionType, tag: str) -> dict:
    """A snapshot of ``function``'s module globals as the namespace of a module of its own,
    registered in ``sys.modules``: torch.compile finds a function's globals again by its
    module's name, and under the original's name it would look for kiln's globals in the
    original's module, where they are not."""
    name = f"{__name__}.copies.{function.__module__}.{function.__qualname__}.{id(function):x}.{tag}"
    module = types.ModuleType(name)
    own = ("__name__", "__spec__", "__loader__")
    module.__dict__.update({k: v for k, v in function.__globals__.items() if k not in own})
    sys.modules[name] = module
    return module.__dict__


def refresh(scope: dict, function: types.FunctionType, own: dict) -> None:
    """Brings a copy's snapshot of ``function``'s module globals up to date (a name rebound
    there since), with the copy's ``own`` names kept."""
    skipped = ("__name__", "__spec__", "__loader__")
    scope.update({k: v for k, v in function.__globals__.items() if k not in skipped})
    scope.update(own)


def kept(copies: dict, key, make: Callable[[], Optional[tuple]]) -> Optional[types.FunctionType]:
    """The copy ``copies`` keeps under ``key``, made by ``make()`` the first time (None, or
    (the copy, its scope, the function whose module globals the scope snapshots, the copy's own
    names in it)); its scope brought up to date (:func:`refresh`) at each call."""
    if key not in copies:
        copies[key] = make()
    if copies[key] is None:
        return None
    copy, scope, function, own = copies[key]
    refresh(scope, function, own)
    return copy


def function_from(code: types.CodeType, scope: dict, like: types.FunctionType) -> types.FunctionType:
    """A function of ``code`` reading ``scope``, with ``like``'s defaults, names and doc."""
    copy = types.FunctionType(code, scope, like.__name__, like.__defaults__)
    copy.__kwdefaults__ = like.__kwdefaults__
    copy.__qualname__, copy.__doc__ = like.__qualname__, like.__doc__
    return copy


def bound_forward(copy: types.FunctionType, module, function: types.FunctionType) -> Callable:
    """``copy`` (an edited copy of the class forward ``function``) as ``module``'s forward; where
    the module's class changed since (FSDP2's fully_shard makes a subclass, whose forward
    transformers wraps again), its class's forward, as the module would run unpatched."""
    bound = copy.__get__(module)

    def forward(*args, **kwargs):
        if type(module).forward is not function:
            return type(module).forward(module, *args, **kwargs)
        return bound(*args, **kwargs)

    return forward

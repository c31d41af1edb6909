"""Statements in notebook code that rebind JAX, NumPy, builtins or the course library (text only).

The pre-flight (:mod:`.integrity`) reads the code cells a student wrote and reports every statement
that rewrites a module the grade depends on, or reaches into the interpreter's frames, for the
instructor to review. Nothing here runs the code: cells are parsed with :mod:`ast` (IPython magics
and shell lines first turned into Python by IPython's own input transformer, when IPython is
importable) and the statements are read in order.

:func:`scan` reads one cell, :func:`scan_cells` a notebook's cells in order, carrying the names
that earlier cells bound to modules (``import jax.numpy as jnp`` in one cell, ``jnp.sum = f`` in a
later one). Each hit is a :class:`Rebinding`: the line, what is rebound (``"jax.grad"``), the kind
and the statement's text.

What is reported
----------------
kind ``"rebind"``:

* an assignment, augmented assignment, annotated assignment (with a value) or ``del`` of an
  attribute or subscript whose base resolves to a protected module (:data:`PROTECTED_ROOTS`, and
  ``sys.modules``): ``jax.grad = f``, ``jnp.sum = f``, ``np.random.seed = f``,
  ``del jax.grad``, ``ppo.clipped_surrogate = f``, ``builtins.print = f``,
  ``__builtins__["len"] = f``, ``vars(np)["sum"] = f``, ``jax.__dict__["grad"] = f``,
  ``sys.modules["jax"] = m``;
* ``setattr`` / ``delattr`` / ``object.__setattr__`` / ``<module>.__setattr__`` on a protected
  module, and the methods that write a namespace (``update``, ``setdefault``, ``pop``,
  ``__setitem__`` ...) called on ``<module>.__dict__``, ``vars(<module>)`` or ``sys.modules``;
* an assignment to ``__code__``, ``__globals__``, ``__defaults__``, ``__kwdefaults__`` or
  ``__class__`` of anything (also through ``setattr`` with that name), and ``importlib.reload``.

kind ``"introspection"``: reading a frame (``tb_frame``, ``f_back``, ``f_locals``, ``f_globals``,
``f_builtins``, ``gi_frame``, ``cr_frame``, ``ag_frame``), calling :data:`INTROSPECTION_CALLS`
(``sys._getframe``, ``inspect.stack``, ``gc.get_referrers``, ``sys.settrace`` ...), and any use
of ``ctypes``.

What is not reported
--------------------
* Calls of the libraries' own API, even when they change a library's state: ``np.random.seed(0)``,
  ``jax.config.update("jax_enable_x64", True)``, ``jax.config.update("jax_disable_jit", True)``.
  They are the documented way to configure a library, not a rebinding of one of its names: the
  grade does not depend on them (the judge computes its own values, and differentiates the
  program a function traces to with its own JAX, :mod:`rlhf_lab.judging.program`), and course
  material calls them.
* Reading attributes (``jax.grad(f)``, ``g = jnp.sum``).
* Attributes of ordinary objects: ``self.grad = g``, ``state.params = p``, ``cfg.beta = 0.1``, and
  modules that are not protected (``plt.rcParams["figure.dpi"] = 100``).
* Rebinding a *name* in the notebook's own namespace (``float = int``, ``np = 3``): that changes
  the student's namespace, not the module, and the judge never reads it.

How a name is resolved (kept simple on purpose)
-----------------------------------------------
A name stands for a module path while the statements read so far bound it to one: ``import``
and ``from ... import`` (``import numpy as np``: ``np`` is ``numpy``; ``from jax import lax``:
``lax`` is ``jax.lax``), or a plain assignment whose value resolves (``G = grading``,
``T = np.testing``). Any other binding of the name ends that: a plain assignment of anything else
(``np = 3`` then ``np.x = 1`` is not reported), ``del np``, a ``for`` or ``with`` target, a
function or class definition of that name. Inside a function or lambda its parameters hide the
names outside; a function body is read once, where it is defined, with the names known there.
``__builtins__`` and the built-in functions (``setattr``, ``vars``, ``getattr``, ``object``,
``__import__``) resolve to :mod:`builtins` until rebound. Constant look-ups are followed:
``getattr(np, "testing")``, ``__import__("numpy")``, ``importlib.import_module("jax")``,
``sys.modules["jax"]``. A name computed at run time (``getattr(np, "te" + "sting")``,
``exec(code)`` of a string built at run time) is not; this is a review aid that reads text, and
the grade never depended on the student's kernel in the first place. Constant strings given to
``exec`` and to the ``%time`` / ``%timeit`` / ``%prun`` / ``%%capture`` magics are read as code.
"""
from __future__ import annotations

import ast
import dataclasses

#: Modules whose attributes a student's code must not rewrite (each with all its submodules).
PROTECTED_ROOTS = frozenset({"jax", "jaxlib", "numpy", "optax", "builtins", "rlhf_lab", "IPython", "ipykernel"})
#: Protected objects that are attributes of a module that is not itself protected.
PROTECTED_PATHS = ("sys.modules",)
#: Function and object internals whose assignment swaps behaviour behind a name, on anything.
INTERNALS = frozenset({"__code__", "__globals__", "__defaults__", "__kwdefaults__", "__class__"})
#: Attributes that reach a frame (and through it every namespace on the stack).
FRAME_ATTRIBUTES = frozenset({"tb_frame", "f_back", "f_locals", "f_globals", "f_builtins", "gi_frame",
                              "cr_frame", "ag_frame"})
#: Calls that reach frames or every live object, or trace execution.
INTROSPECTION_CALLS = frozenset({
    "sys._getframe", "sys._current_frames", "inspect.currentframe", "inspect.stack", "inspect.trace",
    "inspect.getouterframes", "inspect.getinnerframes", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile",
})
#: Calls that re-execute a module (``importlib.reload(grading)`` after patching it).
RELOAD_CALLS = frozenset({"importlib.reload", "imp.reload"})
#: Methods that write a namespace dict (``jax.__dict__.update(...)``, ``sys.modules.pop("jax")``).
NAMESPACE_WRITERS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"})
#: ``setattr``-like functions: the object is their first argument, the name the second.
SETATTR_CALLS = frozenset({"builtins.setattr", "builtins.delattr", "builtins.object.__setattr__",
                           "builtins.object.__delattr__", "builtins.type.__setattr__", "builtins.type.__delattr__"})
#: Built-in names that resolve to :mod:`builtins` until the notebook rebinds them.
BUILTIN_NAMES = ("setattr", "delattr", "vars", "getattr", "object", "type", "__import__", "exec")
#: Magics whose argument (line magic) or body (cell magic) is Python run in the user's namespace.
CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})

REBIND = "rebind"
INTROSPECTION = "introspection"


@dataclasses.dataclass(frozen=True)
class Rebinding:
    """One statement that rebinds a protected module's attribute (``kind="rebind"``) or reaches
    into the interpreter (``kind="introspection"``).

    ``line`` is 1-based in the cell; ``target`` what is rebound or read (``"jax.grad"``,
    ``"sys._getframe"``); ``text`` the statement on one line (only the first line of a compound
    statement such as ``for`` or ``def``)."""

    line: int
    target: str
    kind: str
    text: str


def initial_names() -> dict:
    """The names every cell starts with before any import: ``__builtins__`` and :data:`BUILTIN_NAMES`."""
    names = {name: f"builtins.{name}" for name in BUILTIN_NAMES}
    names["__builtins__"] = "builtins"
    return names


def scan(source: str) -> list[Rebinding]:
    """Every reported statement of one cell, in order (``[]`` when the cell does not parse)."""
    return [hit for _, hit in scan_cells([source])]


def scan_cells(sources: list[str]) -> list[tuple[int, Rebinding]]:
    """``[(cell index, Rebinding)]`` for the cells of one notebook read in order: names bound to
    modules by earlier cells (``import jax.numpy as jnp``) are known in later ones."""
    names = initial_names()
    out: list[tuple[int, Rebinding]] = []
    for index, source in enumerate(sources):
        out.extend((index, hit) for hit in scan_with(source, names))
    return out


def scan_with(source: str, names: dict) -> list[Rebinding]:
    """Like :func:`scan`, starting from (and updating) ``names``: ``{name: module path}``."""
    tree = _parse(source)
    if tree is None:
        return []
    reader = _Reader(names, source.splitlines())
    reader.body(tree.body)
    return reader.found


# ------------------------------------------------------------------------------------------ parsing
def _to_python(source: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython missing or refusing the cell: drop magic lines
        return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _parse(source: str):
    try:
        return ast.parse(_to_python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _constant_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _unparse(node) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001
        return type(node).__name__


def protected(path: str | None) -> bool:
    """Whether a resolved module path is (inside) a protected module or ``sys.modules``."""
    if not path:
        return False
    if path.split(".", 1)[0] in PROTECTED_ROOTS:
        return True
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in PROTECTED_PATHS)


def resolve(node, names: dict) -> str | None:
    """The module path an expression stands for (``jnp.sum`` -> ``"jax.numpy.sum"``), or None."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = resolve(node.value, names)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Subscript):
        base, key = resolve(node.value, names), _constant_str(node.slice)
        if base == "sys.modules" and key:
            return key
        if base and base.endswith(".__dict__") and key:
            return f"{base[: -len('.__dict__')]}.{key}"
        return None
    if isinstance(node, ast.Call):
        func = resolve(node.func, names)
        first = _constant_str(node.args[0]) if node.args else None
        if func == "builtins.__import__" and first:
            fromlist = node.args[3] if len(node.args) > 3 else next(
                (k.value for k in node.keywords if k.arg == "fromlist"), None)
            wants_leaf = fromlist is not None and not (isinstance(fromlist, ast.Constant) and not fromlist.value)
            return first if wants_leaf else first.split(".")[0]
        if func == "importlib.import_module" and first:
            return first
        if func == "builtins.getattr" and len(node.args) >= 2 and _constant_str(node.args[1]):
            base = resolve(node.args[0], names)
            return f"{base}.{_constant_str(node.args[1])}" if base else None
        if func == "builtins.vars" and len(node.args) == 1:
            base = resolve(node.args[0], names)
            return f"{base}.__dict__" if base else None
    return None


# ------------------------------------------------------------------------------------------ reading
_TRY = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor, ast.While, ast.If,
             ast.With, ast.AsyncWith, ast.Match) + _TRY


class _Reader:
    """Reads statements in order, keeping ``names`` up to date and collecting :class:`Rebinding`s."""

    def __init__(self, names: dict, lines: list[str], line_offset: int = 0, depth: int = 0, pin=None):
        self.names = names
        self.lines = lines  # the cell as written (IPython's transform keeps one line per line)
        self.offset = line_offset  # line of the cell = line of the parsed code + offset
        self.depth = depth
        self.pin = pin  # (line, text) of the statement that holds this code in a string, or None
        self.current = None  # the statement being read
        self.found: list[Rebinding] = []
        self.hits: list[tuple[str, str]] = []  # (kind, target) of the statement being read

    # -- statements ---------------------------------------------------------------------------
    def body(self, stmts) -> None:
        for stmt in stmts:
            self.statement(stmt)

    def statement(self, stmt) -> None:
        outer, self.hits = self.hits, []
        outer_stmt, self.current = self.current, stmt
        try:
            self._statement(stmt)
        finally:
            self.current = outer_stmt
        hits, self.hits = self.hits, outer
        if hits:
            rebinds = [h for h in hits if h[0] == REBIND]
            kind, target = (rebinds or hits)[0]
            line, text = self.pin or (stmt.lineno + self.offset, self._text(stmt))
            self.found.append(Rebinding(line, target, kind, text))

    def _text(self, stmt) -> str:
        """The statement as written in the cell, on one line (a compound statement: its first line)."""
        first = stmt.lineno + self.offset
        last = first if isinstance(stmt, _COMPOUND) else (stmt.end_lineno or stmt.lineno) + self.offset
        text = " ".join(self.lines[first - 1: last])
        return " ".join(text.split()) or " ".join(_unparse(stmt).split())

    def _statement(self, stmt) -> None:  # noqa: C901 - one branch per statement type
        n = self.names
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    n[a.asname] = a.name
                else:
                    n[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(stmt, ast.ImportFrom):
            for a in stmt.names:
                if a.name == "*":
                    continue
                if stmt.level or not stmt.module:
                    n.pop(a.asname or a.name, None)
                else:
                    n[a.asname or a.name] = f"{stmt.module}.{a.name}"
        elif isinstance(stmt, ast.Assign):
            self.expr(stmt.value)
            for t in stmt.targets:
                self.target(t)
            value = resolve(stmt.value, n)
            for t in stmt.targets:
                self.bind(t, value)
        elif isinstance(stmt, ast.AugAssign):
            self.expr(stmt.value)
            self.target(stmt.target)
            self.bind(stmt.target, None)
        elif isinstance(stmt, ast.AnnAssign):
            self.expr(stmt.annotation)
            if stmt.value is not None:
                self.expr(stmt.value)
                self.target(stmt.target)
                self.bind(stmt.target, resolve(stmt.value, n))
        elif isinstance(stmt, ast.Delete):
            for t in stmt.targets:
                self.target(t)
                self.bind(t, None)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for e in stmt.decorator_list + stmt.args.defaults + [d for d in stmt.args.kw_defaults if d]:
                self.expr(e)
            self.nested(stmt.body, _parameters(stmt.args))
            n.pop(stmt.name, None)
        elif isinstance(stmt, ast.ClassDef):
            for e in stmt.decorator_list + stmt.bases + [k.value for k in stmt.keywords]:
                self.expr(e)
            self.nested(stmt.body, ())
            n.pop(stmt.name, None)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.expr(stmt.iter)
            self.target(stmt.target)
            self.bind(stmt.target, None)
            self.body(stmt.body)
            self.body(stmt.orelse)
        elif isinstance(stmt, (ast.While, ast.If)):
            self.expr(stmt.test)
            self.body(stmt.body)
            self.body(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.target(item.optional_vars)
                    self.bind(item.optional_vars, None)
            self.body(stmt.body)
        elif isinstance(stmt, _TRY):
            self.body(stmt.body)
            for h in stmt.handlers:
                if h.type is not None:
                    self.expr(h.type)
                if h.name:
                    n.pop(h.name, None)
                self.body(h.body)
            self.body(stmt.orelse)
            self.body(stmt.finalbody)
        elif isinstance(stmt, ast.Match):
            self.expr(stmt.subject)
            for case in stmt.cases:
                for node in ast.walk(case.pattern):
                    name = getattr(node, "name", None)
                    if isinstance(name, str):
                        n.pop(name, None)
                if case.guard is not None:
                    self.expr(case.guard)
                self.body(case.body)
        elif isinstance(stmt, ast.Expr) and self._code_magic(stmt):
            pass
        else:  # Expr, Return, Raise, Assert, Global, Pass, ...
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def nested(self, stmts, hidden) -> None:
        """A function or class body: its own copy of the names, ``hidden`` (parameters) removed;
        its statements are reported like any other."""
        saved = self.names
        self.names = {k: v for k, v in saved.items() if k not in set(hidden)}
        try:
            self.body(stmts)
        finally:
            self.names = saved

    def bind(self, target, value: str | None) -> None:
        """A binding of ``target``: a name stands for ``value`` (a module path) or for nothing."""
        if isinstance(target, ast.Name):
            if value:
                self.names[target.id] = value
            else:
                self.names.pop(target.id, None)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind(elt, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, None)

    def target(self, t) -> None:
        """Hits of an assignment or ``del`` target (what it writes, and what its base reads)."""
        if isinstance(t, ast.Attribute):
            base = resolve(t.value, self.names)
            if t.attr in INTERNALS:
                self.hits.append((REBIND, _unparse(t)))
            elif protected(base):
                self.hits.append((REBIND, f"{base}.{t.attr}"))
            self.expr(t.value)
        elif isinstance(t, ast.Subscript):
            base, key = resolve(t.value, self.names), _constant_str(t.slice)
            if protected(base):
                if key and base.endswith(".__dict__"):  # vars(np)["sum"], jax.__dict__["grad"]
                    what = f"{base[: -len('.__dict__')]}.{key}"
                elif key and base == "builtins":  # __builtins__["len"]
                    what = f"builtins.{key}"
                else:
                    what = f"{base}[{_unparse(t.slice)}]"
                self.hits.append((REBIND, what))
            self.expr(t.value)
            self.expr(t.slice)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for elt in t.elts:
                self.target(elt)
        elif isinstance(t, ast.Starred):
            self.target(t.value)

    # -- expressions --------------------------------------------------------------------------
    def expr(self, node) -> None:
        """Hits inside an expression (calls, frame reads, ``ctypes``); a walrus rebinds its name."""
        if node is None:
            return
        if isinstance(node, (ast.Name, ast.Attribute)):
            path = resolve(node, self.names)
            if path and (path == "ctypes" or path.startswith("ctypes.")):
                self.hits.append((INTROSPECTION, path))
                return
            if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
                self.hits.append((INTROSPECTION, _unparse(node)))
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.NamedExpr):
            self.expr(node.value)
            self.bind(node.target, resolve(node.value, self.names))
            return
        elif isinstance(node, ast.Lambda):
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d]:
                self.expr(d)
            self._hidden_expr(node.body, _parameters(node.args))
            return
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            bound = [x.id for g in node.generators for x in ast.walk(g.target) if isinstance(x, ast.Name)]
            self.expr(node.generators[0].iter)
            rest = [g.iter for g in node.generators[1:]] + [c for g in node.generators for c in g.ifs]
            rest += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for e in rest:
                self._hidden_expr(e, bound)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
            elif isinstance(child, ast.keyword):
                self.expr(child.value)

    def _hidden_expr(self, node, hidden) -> None:
        saved = self.names
        self.names = {k: v for k, v in saved.items() if k not in set(hidden)}
        try:
            self.expr(node)
        finally:
            self.names = saved

    def call(self, node: ast.Call) -> None:
        n = self.names
        func = resolve(node.func, n)
        first = node.args[0] if node.args else None
        name = _constant_str(node.args[1]) if len(node.args) > 1 else None
        if func in INTROSPECTION_CALLS:
            self.hits.append((INTROSPECTION, func))
        elif func in RELOAD_CALLS:
            self.hits.append((REBIND, func))
        elif func in SETATTR_CALLS and first is not None:
            base = resolve(first, n)
            if protected(base):
                self.hits.append((REBIND, f"{base}.{name or '*'}"))
            elif name in INTERNALS:
                self.hits.append((REBIND, f"{_unparse(first)}.{name}"))
        elif func == "builtins.exec" and first is not None and _constant_str(first) is not None:
            self._inline(_constant_str(first), pinned=True)
        elif isinstance(node.func, ast.Attribute):
            base = resolve(node.func.value, n)
            method = node.func.attr
            if method in ("__setattr__", "__delattr__") and protected(base):
                attr = _constant_str(first) if first is not None else None
                self.hits.append((REBIND, f"{base}.{attr or '*'}"))
            elif method in NAMESPACE_WRITERS and base and protected(base) and \
                    (base.endswith(".__dict__") or base in PROTECTED_PATHS):
                self.hits.append((REBIND, f"{base}.{method}"))
        for child in [node.func] + node.args + [k.value for k in node.keywords]:
            self.expr(child)

    # -- code inside strings ------------------------------------------------------------------
    def _code_magic(self, stmt: ast.Expr) -> bool:
        """``get_ipython().run_line_magic('time', code)`` / ``run_cell_magic('capture', '', body)``
        (IPython's transform of ``%time`` / ``%%capture``): the code is read as statements."""
        call = stmt.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("run_line_magic", "run_cell_magic")
                and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
                and call.func.value.func.id == "get_ipython" and len(call.args) >= 2):
            return False
        magic = _constant_str(call.args[0])
        if magic not in CODE_MAGICS:
            return False
        if call.func.attr == "run_line_magic":
            code = _constant_str(call.args[1])
        else:
            code = _constant_str(call.args[2]) if len(call.args) > 2 else None
        if code is None:
            return False
        line_magic = call.func.attr == "run_line_magic"
        self._inline(code, pinned=line_magic, offset=stmt.lineno)  # a cell magic's body: the lines below it
        return True

    def _inline(self, code: str, pinned: bool, offset: int = 0) -> None:
        """Statements given as a constant string (``exec``, code magics), read with the same names.

        ``pinned``: every hit is reported at the line and with the text of the statement that holds
        the string (``exec("...")``, ``%time ...``); otherwise the string's lines are the cell's
        lines from ``offset`` on (a cell magic's body)."""
        if self.depth >= 5:
            return
        tree = _parse(code)
        if tree is None:
            return
        pin = self.pin
        if pinned and pin is None and self.current is not None:
            pin = (self.current.lineno + self.offset, self._text(self.current))
        inner = _Reader(self.names, self.lines, self.offset + offset, self.depth + 1, pin)
        inner.body(tree.body)
        self.found.extend(inner.found)


def _parameters(args: ast.arguments) -> list[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return [a.arg for a in every]

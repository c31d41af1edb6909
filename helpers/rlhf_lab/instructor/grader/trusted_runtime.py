"""Gradients the notebook's own code cannot rewrite: a fresh, sandboxed Python per notebook.

A gradient check asks for ``jax.grad(f, argnums)(*args)`` of the student's function ``f``. Asked
of the student's kernel, the answer is whatever ``jax.grad`` means THERE, and a notebook can rebind
it (``jax.grad = lambda f, argnums=0: ...``), patch ``jax._src.api``, ``jax.lax.stop_gradient``,
NumPy or builtins, or replace the grader's bridge after it was installed. So the judge asks a
:class:`TrustedRuntime` instead:

* one process per notebook, started lazily on the notebook's first gradient request and kept for
  its other ones, inside the same bubblewrap sandbox as a grading kernel (:mod:`.sandbox`: no
  network, own PID namespace, its own unprivileged user id when the grader is root, the notebook's
  library build read-only, the notebook's folder as working directory) and under the kernel's
  resource limits;
* it imports NumPy, JAX and the wire module (:mod:`rlhf_lab.judging.wire`, sent as source text)
  and captures ``jax.grad`` and every function it uses BEFORE any notebook code runs, warms JAX
  up, then records the identity of every attribute (and of every function's code) of JAX, NumPy,
  builtins and the standard modules they use, and installs an audit hook;
* it then runs only the cells the requested function needs (:func:`needed_cells`): code cells
  above the test cell, test cells excluded, chosen by the names they bind, in notebook order;
* it computes the gradient with the captured ``jax.grad`` and answers with the wire's plain data,
  bounded in size (the wire's limits) and time (the cell timeout).

Anything the notebook did to JAX, NumPy, builtins or the runtime itself while it ran (rebinding or
deleting an attribute, replacing a function's code, replacing a module in ``sys.modules``) and any
attempt to start threads or processes, use ``ctypes``, install a trace function or walk the
garbage collector's objects makes the gradient check FAIL with the cell that did it named; a
NumPy-only loss fails because JAX cannot trace it. Student code runs only inside the runtime's
"student phases" (cells, and the function while it is differentiated); each answer echoes a fresh
random token of its request, so output the notebook writes itself is not taken for an answer.

What remains possible for a determined forger (documented, not silently ignored): code that walks
from an exception's traceback to the runtime's own frames to read the current token and writes a
made-up answer to the runtime's output pipe. :mod:`.rebinding` reports such introspection
(``tb_frame``, ``f_back``, ``f_locals``, ``os.write``...) in the pre-flight for a human to review.

This module uses the standard library only at import time (``rlhf_lab`` is imported lazily, in
the grader process that already runs the judge), and loads :mod:`.sandbox` by file path under the
name ``nbgrader_config.py`` gives it, so both share one module.
"""
from __future__ import annotations

import ast
import atexit
import importlib.util
import inspect
import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import weakref

#: ``RLHF_TRUSTED_GRADIENTS=0`` asks the kernel for gradients, as before (benchmark baseline only).
ENABLE_ENV = "RLHF_TRUSTED_GRADIENTS"
#: Seconds the runtime may take to start (import JAX, warm up) before it counts as broken.
START_TIMEOUT = 120.0
#: Largest answer line read from the runtime (the wire's largest array, base64, plus framing).
MAX_LINE = 2 * 64 * 1024 * 1024 + 65536
#: Largest prefetch request (bytes): it waits in the pipe until the runtime has imported JAX, and a
#: pipe holds 64 KiB, so a larger one would block the grader.
PREFETCH_MAX_BYTES = 32 * 1024
_SANDBOX_NAME = "rlhf_lab_course_sandbox"
#: Runtimes of this process that may still have a process (stopped at exit).
_LIVE: "weakref.WeakSet[TrustedRuntime]" = weakref.WeakSet()

# The program of the runtime (``python -I -c RUNNER``). It reads JSON lines on fd 0 and writes JSON
# lines on fd 1; both are moved away from 0/1/2 first (the notebook's prints go to /dev/null).
RUNNER = r'''
import os as _os
_IN, _OUT = _os.dup(0), _os.dup(1)
_null = _os.open(_os.devnull, _os.O_RDWR)
for _fd in (0, 1, 2):
    _os.dup2(_null, _fd)
_os.close(_null)
_read, _write = _os.read, _os.write
import builtins as _builtins
import gc as _gc
import json as _json
import signal as _signal
import sys as _sys
import types as _types
import ctypes as _ctypes  # imported before the audit hook: importing it later would be refused
import numpy as _np
import jax as _jax
import jax.numpy as _jnp

_loads, _dumps, _exec, _compile, _id, _type = _json.loads, _json.dumps, _builtins.exec, _builtins.compile, _builtins.id, _builtins.type
_isinstance, _getattr, _list, _str, _repr, _len = _builtins.isinstance, _builtins.getattr, _builtins.list, _builtins.str, _builtins.repr, _builtins.len
_grad = _jax.grad
_buffer = bytearray()


def _recv():
    """One JSON line from the grader."""
    global _buffer
    while b"\n" not in _buffer:
        chunk = _read(_IN, 1 << 20)
        if not chunk:
            _os._exit(0)
        _buffer += chunk
    line, _, rest = bytes(_buffer).partition(b"\n")
    _buffer = bytearray(rest)
    return _loads(line.decode("utf-8"))


def _send(body):
    data = (_dumps(body) + "\n").encode("utf-8")
    while data:
        data = data[_write(_OUT, data):]


_setup = _recv()
# the installed modules the notebook imports, imported now, before the snapshot and the audit hook:
# importing them (matplotlib's font cache runs a subprocess, JAX and the course library set class
# attributes) is the trusted code of the environment, not the notebook's
for _module_name in _setup.get("preimport", ()):
    try:
        __import__(_module_name)
    except BaseException:  # noqa: BLE001 - not installed (or not in this build): the cell reports it
        pass
_wire = _types.ModuleType("_rlhf_trusted_wire")
_exec(_compile(_setup["wire"], "<trusted wire>", "exec"), _wire.__dict__)
_encode, _decode, _Refused = _wire.encode, _wire.decode, _wire.Refused
# warm up: every lazily bound part of JAX used by a gradient exists before the snapshot (the
# backend, the compilation cache's state, tracing and differentiation). Under jit each warm-up is one
# XLA program instead of a program per primitive (0.2 s instead of 1 s of every runtime's start);
# what the notebook's eager code binds later is new attributes, which the snapshot does not guard
_jax.jit(_grad(lambda x, y: _jnp.sum(_jnp.tanh(x) * _jax.lax.stop_gradient(y)), argnums=(0, 1)))(
    _jnp.ones(3), _jnp.ones(3))
_jax.jit(_grad(lambda x: _jnp.mean(_jax.nn.log_softmax(x)[_jnp.array([0, 1])] ** 2)))(_jnp.ones(3))
_decode(_loads(_dumps(_encode((_np.ones(2, _np.float32), 1.5)))), live=True)
_encode(_jnp.ones(2))

_TRUSTED = tuple(_setup["trusted"])
_FORBIDDEN = tuple(_setup["forbidden"])
_FRAMES = frozenset(("gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals"))


def _trusted_name(name):
    return _isinstance(name, _str) and (name in _TRUSTED or name.split(".", 1)[0] in _TRUSTED)


def _snapshot():
    """Identity of every attribute of the trusted modules (and of their functions' code and their
    classes' attributes), and of their ``sys.modules`` entries."""
    out = {}
    for name, module in _list(_sys.modules.items()):
        if not _trusted_name(name):
            continue
        out[("sys.modules", name)] = _id(module)
        namespace = _getattr(module, "__dict__", None)
        if _type(namespace) is not dict:
            continue
        for key, value in _list(namespace.items()):
            out[(name, key)] = _id(value)
            if _type(value) is _types.FunctionType:
                out[(name, key, "__code__")] = _id(value.__code__)
                out[(name, key, "__defaults__")] = _id(value.__defaults__)
                out[(name, key, "__kwdefaults__")] = _id(value.__kwdefaults__)
            elif _isinstance(value, _type) and _getattr(value, "__module__", None) == name:
                for attr, item in _list(value.__dict__.items()):
                    out[(name, key, attr)] = _id(item)
    for key in ("_rlhf_trusted_wire",):
        for attr, item in _list(_wire.__dict__.items()):
            out[(key, attr)] = _id(item)
    return out


_BASE = _snapshot()
# What the audit hook guards: the attributes of the trusted modules' classes and functions as they
# were at the snapshot (rebinding or deleting one, even for a moment, is refused). A NEW attribute of
# a trusted class is not: importing more of JAX or the course library sets some (lazily built
# methods, registries), which is what a notebook's imports cell does.
_GUARDED = set()
for _name, _module in _list(_sys.modules.items()):
    if not _trusted_name(_name) or _type(_getattr(_module, "__dict__", None)) is not dict:
        continue
    for _value in _list(_module.__dict__.values()):
        if _type(_value) is _types.FunctionType:
            for _attr in ("__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__"):
                _GUARDED.add((_id(_value), _attr))
        elif _isinstance(_value, _type) and _getattr(_value, "__module__", None) == _name:
            for _attr in _list(_value.__dict__):
                _GUARDED.add((_id(_value), _attr))
_REPORTED = set()
_HANDLERS = {s: _signal.getsignal(s) for s in _signal.valid_signals() if s not in (_signal.SIGKILL, _signal.SIGSTOP)}
_state = {"student": False, "where": "", "events": []}


def _audit(event, args):
    if not _state["student"]:
        return
    bad = event.startswith(_FORBIDDEN)
    if not bad and event in ("object.__setattr__", "object.__delattr__") and _len(args) > 1:
        target = args[0]
        bad = (_id(target), args[1]) in _GUARDED or (
            _isinstance(target, _types.ModuleType) and _trusted_name(target.__name__))
    if not bad and event == "object.__getattr__" and _len(args) > 1 and args[1] in _FRAMES:
        bad = True
    if bad:
        if _len(_state["events"]) < 20:
            _state["events"].append(_state["where"] + ": " + event)
        raise RuntimeError("not allowed while the grader computes gradients: " + event)


_sys.addaudithook(_audit)
_gc.collect()
_gc.disable()


def _tampering(where):
    """What the last student phase changed (and put back the signal handlers it changed)."""
    found = _list(_state["events"])
    _state["events"].clear()
    now = _snapshot()
    new = [k for k, v in _BASE.items() if now.get(k) != v and k not in _REPORTED]
    _REPORTED.update(new)
    tops = {k[:2] for k in new}
    changed = sorted({("sys.modules[" + _repr(k[1]) + "]") if k[0] == "sys.modules" else
                      ".".join(_str(p) for p in k) for k in new if _len(k) == 2 or k[:2] not in tops})
    if changed:
        found.append(where + ": changed " + ", ".join(changed[:8]) + (" ..." if _len(changed) > 8 else ""))
    for signum, handler in _HANDLERS.items():
        try:
            if _signal.getsignal(signum) is not handler:
                found.append(where + ": installed a signal handler")
                _signal.signal(signum, handler)
        except (OSError, ValueError, TypeError):
            pass
    _signal.alarm(0)
    for timer in (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF):
        _signal.setitimer(timer, 0)
    if _gc.isenabled():
        _gc.disable()
    return found


# What the notebook's code can reach is defined in a namespace of its own, so that no function or
# class it is given has the runtime's globals (its pipe descriptors, the request's token) as
# ``__globals__``; and ``sys.modules["__main__"]`` is not the runtime's module either.
_given = {"__builtins__": _builtins, "__name__": "__main__"}
_exec(_compile("""
class _Shell:
    \"\"\"get_ipython() of the runtime: magics and shell commands do nothing.\"\"\"

    def __getattr__(self, name):
        return lambda *a, **k: None


_shell = _Shell()


def get_ipython():
    return _shell


def display(*args, **kwargs):
    return None
""", "<trusted runtime shell>", "exec"), _given)
_ns = {"__name__": "__main__", "__builtins__": _builtins, "get_ipython": _given["get_ipython"],
       "display": _given["display"]}
_sys.modules["__main__"] = _types.ModuleType("__main__")


def _student(where, work):
    """Run ``work()`` as student code; returns ``(result, error text or None, tampering)``."""
    _state["student"], _state["where"] = True, where
    result, error = None, None
    try:
        result = work()
    except BaseException as exc:  # noqa: BLE001 - the notebook's exceptions are reported, not obeyed
        try:
            error = _type(exc).__name__ + ": " + _str(exc)[:1500]
        except BaseException:  # noqa: BLE001
            error = "an exception that cannot be printed"
    finally:
        try:
            # finalizers of the cyclic garbage this phase made run now, as student code. Only the
            # youngest generation: a full collection walks all of JAX's objects (0.08 s after every
            # cell); garbage that outlived a phase is never collected (the collector is disabled and
            # nothing else collects), so its finalizers never run at all, least of all as trusted code
            _gc.collect(0)
        except BaseException:  # noqa: BLE001
            pass
        _state["student"] = False
    return result, error, _tampering(where)


def _run(cells):
    failed, tampered = [], []
    for cell in cells:
        code = None
        try:
            code = _compile(cell["source"], "<" + cell["label"] + ">", "exec")
        except SyntaxError as exc:
            failed.append({"label": cell["label"], "error": "SyntaxError: " + _str(exc)[:500]})
            continue
        _, error, bad = _student(cell["label"], lambda: _exec(code, _ns))
        if error:
            failed.append({"label": cell["label"], "error": error})
        tampered += bad
    return {"ok": True, "failed": failed, "tampered": tampered}


def _grad_answer(request, where):
    name, argnums = request.get("name"), request["argnums"]
    if name not in _ns:
        return _dumps({"ok": False, "kind": "missing", "error": _str(name)}), []
    args = [_decode(a, live=True) for a in request.get("args", [])]
    kwargs = {k: _decode(v, live=True) for k, v in request.get("kwargs", {}).items()}
    fn = _ns[name]
    argnums = tuple(argnums) if _isinstance(argnums, _list) else argnums
    out, error, bad = _student(where, lambda: _grad(fn, argnums=argnums)(*args, **kwargs))
    if bad:
        return _dumps({"ok": False, "kind": "tampered", "error": "; ".join(bad)}), bad
    if error is not None:
        return _dumps({"ok": False, "kind": "raised", "error": error}), []
    try:
        return _dumps({"ok": True, "value": _encode(out)}), []
    except _Refused as exc:
        return _dumps({"ok": False, "kind": "refused", "error": _str(exc)}), []
    except Exception as exc:  # noqa: BLE001
        return _dumps({"ok": False, "kind": "refused", "error": _type(exc).__name__ + ": " + _str(exc)[:500]}), []


_send({"ready": True})
while True:
    _message = _recv()
    _token, _op = _message.get("token"), _message.get("op")
    if _op == "run":
        _send(dict(_run(_message["cells"]), token=_token))
    elif _op == "grad":
        _text, _bad = _grad_answer(_loads(_message["request"]), _message.get("where", "the gradient"))
        _send({"ok": True, "token": _token, "response": _text, "tampered": _bad})
    else:
        _os._exit(0)
'''

#: Top-level modules whose attributes the notebook must leave alone in the runtime.
TRUSTED_MODULES = ("jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum", "scipy", "builtins", "math", "json",
                   "base64", "os", "posix", "posixpath", "types", "functools", "operator", "itertools",
                   "collections", "contextlib", "weakref", "threading", "dataclasses", "enum", "abc", "copy",
                   "gc", "signal", "ctypes", "_ctypes", "_json", "_functools", "_operator", "_collections",
                   "_weakref", "_thread", "_abc")
#: Audit events refused while notebook code runs (prefixes, see ``sys.addaudithook``). Not
#: ``sys._getframe``: the standard library and JAX call it on an honest notebook's behalf (namedtuple,
#: typing, warnings, logging...), and frames are reachable without it anyway (an exception's
#: ``__traceback__``); the pre-flight reports frame reads written in the code (:mod:`.rebinding`).
FORBIDDEN_EVENTS = ("_thread.start_new_thread", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                    "os.system", "os.kill", "os.killpg", "subprocess.Popen", "ctypes.", "sys.settrace",
                    "sys.setprofile", "sys._current_frames", "sys.remote_exec",
                    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
                    "signal.pthread_kill", "cpython.")


def enabled(environ=None) -> bool:
    """False only with ``RLHF_TRUSTED_GRADIENTS=0`` (gradients then come from the kernel, as before)."""
    return (os.environ if environ is None else environ).get(ENABLE_ENV, "1") != "0"


def _library_path() -> str:
    """A first line for :data:`RUNNER` when the course library comes from ``PYTHONPATH`` (the hub's
    servers have no installed ``rlhf_lab``: the hub puts the instructor's library on ``PYTHONPATH``),
    which ``-I`` ignores: the runner puts that folder on ``sys.path`` itself (in the sandbox the
    library is bound at the same path). Empty when the library is installed (the venv's own)."""
    parent = _sandbox().library_pythonpath()
    return f"import sys; sys.path.insert(0, {parent!r})\n" if parent else ""


def _sandbox():
    """:mod:`.sandbox`, loaded by file path under the name ``nbgrader_config.py`` uses."""
    if _SANDBOX_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_SANDBOX_NAME, os.path.join(os.path.dirname(__file__),
                                                                                   "sandbox.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[_SANDBOX_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_SANDBOX_NAME]


def _wire_source() -> str:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "judging", "wire.py")
    with open(path, encoding="utf-8") as handle:
        return handle.read()


# --- which cells the runtime runs -----------------------------------------------------------------

MUTATING_METHODS = frozenset(("append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear",
                              "remove", "add", "discard", "sort", "reverse", "fill", "resize", "put",
                              "__setitem__", "__delitem__", "__setattr__"))


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """``(every name the cell binds or mutates, names bound unconditionally at its top level)``."""
    bound, sure = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add("*" if alias.name == "*" else (alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = _root(node)
            if root:
                bound.add(root)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATING_METHODS:
            root = _root(node.func.value)
            if root:
                bound.add(root)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            sure.add(stmt.name)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            sure.update(t.id for t in stmt.targets)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            sure.update(a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*")
    return bound, sure


def _used_names(tree: ast.Module, source: str | None = None) -> set[str]:
    """The names a cell reads from the notebook's namespace: those it reads at its top level, and
    those its functions, classes and comprehensions read as globals (:mod:`symtable`). A function's
    own parameters and locals are not read from the namespace, so an earlier cell that happens to
    bind a variable of the same name (``beta``, ``mask``) is not needed for it. Without ``source``
    (or when :mod:`symtable` cannot read it), every name the cell loads anywhere."""
    if source is not None:
        import symtable

        try:
            top = symtable.symtable(source, "<cell>", "exec")
        except (SyntaxError, ValueError):
            top = None
        if top is not None:
            out: set[str] = set()
            stack = [top]
            while stack:
                table = stack.pop()
                for sym in table.get_symbols():
                    if sym.is_referenced() and (table.get_type() == "module" or sym.is_global()):
                        out.add(sym.get_name())
                stack.extend(table.get_children())
            return out
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def python_source(source: str) -> str:
    """A cell's source as plain Python (IPython magics turned into ``get_ipython()`` calls)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - nbgrader always brings IPython
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - the cell then fails to compile in the runtime, as in a kernel
        return source


def is_test_cell(cell) -> bool:
    """An nbgrader test cell (graded, not an answer): never run by the runtime."""
    meta = (cell.get("metadata") or {}).get("nbgrader") or {}
    return bool(meta.get("grade")) and not meta.get("solution")


def needed_cells(cells, upto: int, name: str) -> list[int]:
    """Indices of the code cells above ``upto`` (test cells excluded) that ``name`` needs, in order.

    Walking up from the test cell: a cell is needed when it binds or mutates a name still needed
    (``def``, assignment, import, ``x[...] =``, ``x.attr =``, ``x.append(...)``...); then the names it
    reads from the namespace are needed too (:func:`_used_names`: not its functions' own locals), and
    a name it binds unconditionally at its top level is satisfied. A cell
    that ``import *`` counts as binding everything; a cell that does not parse is skipped (it would
    fail in the kernel too).
    """
    need, chosen = {name}, []
    for index in range(min(upto, len(cells)) - 1, -1, -1):
        cell = cells[index]
        if cell.get("cell_type") != "code" or is_test_cell(cell):
            continue
        source = python_source(cell.get("source", ""))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        bound, sure = _bound_names(tree)
        if not (bound & need or "*" in bound):
            continue
        chosen.append(index)
        need = (need - sure) | _used_names(tree, source)
    return sorted(chosen)


def imported_modules(cells) -> list[str]:
    """The absolute module names the notebook's code cells import (``import a.b``: ``a.b``; ``from a
    import b``: ``a`` and ``a.b``, which may be a submodule), in order, each once. The runtime imports
    them before any notebook code runs; only installed modules can be found there (its working folder
    is empty), so this runs nothing of the student's."""
    out: list[str] = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(python_source(cell.get("source", "")))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
            out += [n for n in names if n not in out and n.replace(".", "").replace("_", "").isalnum()]
    return out[:200]


def cell_label(cells, index: int) -> str:
    """``cell 7 (grade_id)``: how messages name a cell."""
    meta = (cells[index].get("metadata") or {}).get("nbgrader") or {}
    grade_id = meta.get("grade_id")
    return f"cell {index}" + (f" ({grade_id})" if grade_id else "")


# --- the process ----------------------------------------------------------------------------------

class RuntimeBroken(Exception):
    """The runtime died, stopped answering or answered something unreadable."""


class _Held:
    """What a runtime holds outside this process: its process, scratch folder, uid slot and private
    compile-cache copy. :meth:`release` frees all of it; it is what :meth:`TrustedRuntime.close` and
    the finalizer of a runtime dropped without ``close()`` call (so it must not refer to the runtime)."""

    __slots__ = ("proc", "scratch", "scratch_dir", "slot", "cache_copy")

    def __init__(self):
        self.proc = self.scratch = self.scratch_dir = self.slot = self.cache_copy = None

    def release(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        scratch, self.scratch = self.scratch, None
        if scratch is not None:
            scratch.remove()
        folder, self.scratch_dir = self.scratch_dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()
        copy, self.cache_copy = self.cache_copy, None
        if copy is not None:  # a compile_cache.PrivateCopy (its writer is waited for), or a folder
            remove = getattr(copy, "remove", None)
            if remove is not None:
                remove()
            else:
                shutil.rmtree(copy, ignore_errors=True)


def _held(name: str) -> property:
    return property(lambda self: getattr(self._held, name), lambda self, value: setattr(self._held, name, value))


class TrustedRuntime:
    """The gradients of one notebook's functions, computed where the notebook's other code never ran.

    ``cells``: the notebook's cells (nbformat dicts, in order); ``cwd``: the notebook's folder;
    ``upto``: index of the test cell being judged (set before each check, see :func:`for_cell`);
    ``km``: the notebook kernel's manager (its sandbox settings, library build and limits are
    reused; ``None``: defaults); ``who``: how log lines name the notebook (student/assignment/file).
    """

    def __init__(self, cells, cwd: str, *, timeout: float = 60.0, km=None, who: str = "", log=None):
        self.cells, self.cwd, self.timeout, self.km, self.who, self.log = list(cells), cwd, timeout, km, who, log
        self.upto = len(self.cells)
        self.cell_timeout = timeout
        #: seconds spent in :meth:`grad` (all of it), processes started, and the last call's overhead
        self.request_seconds, self.starts = 0.0, 0
        self.last_overhead, self.timed_out = 0.0, False
        self._ready, self._spawned, self._ready_at = False, 0.0, 0.0
        self._held = _Held()  # released by close(), or by the finalizer when dropped without close()
        self._buffer = b""
        self._inflight: tuple[str, list[int], float] | None = None  # a prefetch whose answer is unread
        self._ran: list[int] = []
        self._failed: dict[int, str] = {}
        self._tampered: list[str] = []
        weakref.finalize(self, self._held.release)
        _LIVE.add(self)

    _proc = _held("proc")
    _slot = _held("slot")
    _scratch = _held("scratch")
    _scratch_dir = _held("scratch_dir")
    _cache_copy = _held("cache_copy")

    # -- the public vocabulary of a Student --------------------------------------------------------
    def grad(self, name: str, argnums, *args, **kwargs):
        """``jax.grad(name, argnums)(*args, **kwargs)`` as plain data (``GradingError`` with a message
        for the student when it cannot be computed or cannot be trusted).

        Afterwards :attr:`last_overhead` is the time spent starting the runtime and re-running cells
        (the grader's work, not the student's) and :attr:`timed_out` says whether the gradient itself
        ran out of :attr:`timeout`."""
        from rlhf_lab.judging import core, wire

        self.last_overhead, self.timed_out = 0.0, False
        request = wire.request("grad", name, args, kwargs, argnums=argnums)
        started = time.monotonic()
        try:
            try:
                self._prepare(name)
            finally:
                self.last_overhead = time.monotonic() - started
            reply = self._ask({"op": "grad", "request": request, "where": f"jax.grad of {name}"}, self.timeout)
        except TimeoutError:
            self.close()
            self.timed_out = time.monotonic() - started - self.last_overhead >= self.timeout
            raise core.GradingError(f"{name}: the gradient of your function was not computed within "
                                    f"{self.timeout:g} s when the grader re-ran your cells in a fresh Python "
                                    "(an infinite loop, or far too much work for this test?)") from None
        except RuntimeBroken as exc:
            self.close()
            raise core.GradingError(f"{name}: the grader could not compute the gradient of your function in a "
                                    f"fresh Python ({exc}); make sure the notebook runs from the top in a new "
                                    "kernel") from None
        finally:
            self.request_seconds += time.monotonic() - started
        if self._tampered:
            raise core.GradingError(self._tamper_message(name, self._tampered))
        try:
            ok, payload = wire.response(reply.get("response"))
        except (wire.Refused, ValueError, TypeError) as exc:
            raise core.GradingError(f"{name}: the gradient could not be read ({exc})") from None
        if not ok:
            raise core.GradingError(self._failure_message(name, *payload))
        return core.plain(payload, f"{name}: its gradient")

    def close(self) -> None:
        """Stop the runtime (it is started again, from a fresh interpreter, when needed)."""
        self._held.release()
        self._buffer, self._ran, self._failed, self._ready = b"", [], {}, False
        self._inflight = None

    # -- messages ------------------------------------------------------------------------------------
    def _failed_cells(self) -> str:
        if not self._failed:
            return ""
        shown = "; ".join(f"{label}: {error}" for label, error in list(self._failed.items())[:3])
        return f" (cells that failed when re-run on their own: {shown})"

    def _failure_message(self, name: str, kind: str, error: str) -> str:
        if kind == "missing":
            return (f"{name}: `{name}` is not defined when the grader re-runs your notebook's cells above this "
                    f"test in a fresh Python{self._failed_cells()}: define it in an answer cell that runs on its "
                    "own from the top")
        if kind == "tampered":
            return self._tamper_message(name, [error])
        if kind == "refused":
            return f"{name}: its gradient: expected numbers or arrays (or a tuple of them), got {error}"
        hint = ""
        if "Tracer" in error or "ConcretizationTypeError" in error:
            hint = (" jax.grad cannot differentiate through NumPy (np.*), float(), .item() or Python "
                    "if/else on traced values: build the loss from jax.numpy operations.")
        return (f"{name}: jax.grad could not differentiate your function ({error}).{hint}"
                f"{self._failed_cells()}").rstrip()

    @staticmethod
    def _tamper_message(name: str, found: list[str]) -> str:
        shown = "; ".join(found[:4])
        return (f"{name}: no points for this gradient test: while the grader re-ran your notebook's cells, "
                f"they changed JAX, NumPy, builtins or the grader itself ({shown}). Remove that code (the "
                "grader computes gradients with its own jax.grad) and ask the instructor to regrade.")

    # -- the runtime's life ----------------------------------------------------------------------------
    def _prepare(self, name: str) -> None:
        """Start the runtime if needed and run the cells ``name`` needs that have not run yet."""
        if self._proc is not None:
            self._await_ready()
            self._settle()
        wanted = needed_cells(self.cells, self.upto, name)
        if self._proc is not None and any(i < max(self._ran, default=-1) for i in wanted if i not in self._ran):
            self.close()  # an earlier cell is needed now: run everything again in notebook order
        self.start()
        self._await_ready()
        todo = [i for i in wanted if i not in self._ran]
        if not todo:
            return
        reply = self._ask({"op": "run", "cells": self._cell_sources(todo)}, self.cell_timeout * len(todo))
        self._record_run(todo, reply)

    def _cell_sources(self, indices: list[int]) -> list[dict]:
        return [{"label": cell_label(self.cells, i), "source": python_source(self.cells[i].get("source", ""))}
                for i in indices]

    def _record_run(self, todo: list[int], reply: dict) -> None:
        self._ran += todo
        for item in reply.get("failed", []):
            self._failed[str(item.get("label"))] = str(item.get("error"))[:300]
        self._tampered += [str(t) for t in reply.get("tampered", [])]

    def _await_ready(self) -> None:
        """Read the started runtime's "ready" line (once)."""
        if self._ready:
            return
        started = time.monotonic()
        try:
            ready = self._read(START_TIMEOUT)
        except TimeoutError:
            self.close()
            raise RuntimeBroken(f"it did not start within {START_TIMEOUT:g} s") from None
        if not ready.get("ready"):
            self.close()
            raise RuntimeBroken("it did not start")
        self._ready, self._ready_at = True, time.monotonic()
        if self.log is not None:
            self.log.info("trusted gradient runtime for %s ready %.1f s after it started (%.1f s waited)",
                          self.who or self.cwd, time.monotonic() - self._spawned, time.monotonic() - started)

    def prefetch(self, names, upto: int) -> bool:
        """Have the started runtime run now, in notebook order, the cells the functions ``names`` need
        above the test cell ``upto`` (what :meth:`grad` would run for them at that cell), without
        waiting: the answer is read by the next request (:meth:`_settle`). The judge calls this when
        the runtime starts, for the notebook's first gradient check, so those cells run while the
        kernel runs the notebook. Nothing is sent when a request is already in flight, when cells
        have run, or when the request would not fit in the pipe (the runtime reads it only once it
        has imported JAX, and writing must not wait). True when the request was sent."""
        if self._proc is None or self._inflight is not None or self._ran:
            return False
        todo = sorted(set().union(*(needed_cells(self.cells, upto, str(n)) for n in names))) if names else []
        if not todo:
            return False
        token = secrets.token_hex(16)
        line = json.dumps({"op": "run", "cells": self._cell_sources(todo), "token": token})
        if len(line.encode("utf-8")) > PREFETCH_MAX_BYTES:
            return False
        self._write(json.loads(line))
        self._inflight = (token, todo, time.monotonic() + START_TIMEOUT + self.cell_timeout * len(todo))
        return True

    def _settle(self) -> None:
        """Read the answer to the request :meth:`prefetch` sent (``TimeoutError`` when its cells
        outlast their time, as when :meth:`_prepare` runs them)."""
        if self._inflight is None:
            return
        token, todo, deadline = self._inflight
        self._inflight = None
        if self._ready:
            # the runtime reads the request once it is ready: from then on the cells have their own
            # time, not the start-up allowance on top (a cell that never ends fails in cell time)
            deadline = min(deadline, self._ready_at + self.cell_timeout * len(todo))
        while True:
            reply = self._read(max(0.0, deadline - time.monotonic()))
            if reply.get("token") == token:
                break
            self._tampered.append("wrote into the grader's channel")
        self._record_run(todo, reply)

    def start(self) -> None:
        """Start the runtime's process (it imports JAX while the grader goes on); no-op if running."""
        if self._proc is not None:
            return
        self._spawned = time.monotonic()
        cmd, kw = self._command()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True, **kw)
        self._tampered, self._ready = [], False
        self.starts += 1
        self._write({"wire": _wire_source(), "trusted": list(TRUSTED_MODULES), "forbidden": list(FORBIDDEN_EVENTS),
                     "preimport": imported_modules(self.cells)})

    def _command(self) -> tuple[list[str], dict]:
        """The runtime's command line and ``Popen`` keywords: sandboxed like a grading kernel."""
        sb = _sandbox()
        kg = sb._kernel_guard
        km = self.km
        python = os.path.join(sys.prefix, "bin", "python")
        inner = [python, "-I", "-c", _library_path() + RUNNER]
        memory = getattr(km, "memory_mb", None) or kg._env_int("RLHF_KERNEL_MEMORY_MB", 4096)
        files = getattr(km, "file_mb", None) or kg._env_int("RLHF_KERNEL_FILE_MB", 1024)
        env = {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_", "TF_CPP_", "LANG", "LC_",
                                                                      "OMP_", "OPENBLAS_", "MKL_", "TZ"))}
        for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
            env.pop(name, None)
        env.update(JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"), MPLBACKEND="Agg", PYTHONHASHSEED="0")
        kw = {"cwd": self.cwd, "preexec_fn": kg.limits_preexec(memory, files)}
        if getattr(km, "no_sandbox", False) or sb.opted_out():
            env.update(HOME=self.cwd, PATH=os.path.dirname(python))
            return inner, dict(kw, env=env)
        bwrap, problem = sb.availability()
        if bwrap is None:
            raise RuntimeBroken(sb.refusal_message(problem))
        readonly = [(p, p) for p in sb.python_roots() if os.path.isdir(p)]
        readonly.append((self._library(sb), sb._installed_library_dir()))
        uid = -1
        if os.geteuid() == 0:
            self._slot = sb.UidSlot(getattr(km, "uid_base", None) or sb._env_int("RLHF_SANDBOX_UID_BASE", 1_500_000))
            uid = self._slot.uid
        nproc = getattr(km, "nproc", None) or sb._default_nproc()
        cwd, extra = self._working_folder(sb, uid)
        writable = self._compile_cache(kg, env, uid)
        cmd = sb.bwrap_command(bwrap, inner, cwd=cwd, readonly=readonly, writable=writable, uid=uid, nproc=nproc,
                               python=python, **extra)
        return cmd, dict(kw, env=sb.sandbox_env(env))

    def _compile_cache(self, kg, env: dict, uid: int) -> list[str]:
        """A private, verified copy of the assignment's compile-cache seed for this runtime, as every
        grading kernel gets its own (:func:`.compile_cache.private_copy`): the cells it re-runs are the
        source's, compiled already. Never the kernel's copy, which the notebook could write. Points
        ``env`` at it and returns it as the runtime's one writable folder (``[]``: no cache)."""
        root = getattr(self.km, "compile_cache_root", "")
        if not root:
            return []
        cc = kg._compile_cache_module()
        try:  # verified now, written while the runtime starts
            copy = cc.start_private_copy(cc.seed_for_notebook_dir(root, os.path.realpath(self.cwd)))
        except Exception:  # noqa: BLE001 - no cache is always a safe fallback
            copy = None
        if copy is None:
            return []
        self._cache_copy = copy
        if uid >= 0:
            _sandbox()._chown_tree(str(copy.path), uid, uid)
        env.update(cc.kernel_env(copy.path))
        return [str(copy.path)]

    def _working_folder(self, sb, uid: int) -> tuple[str, dict]:
        """The runtime's working folder: an EMPTY private folder (the runtime never sees the notebook's
        files; the course's cells read none), at the notebook folder's path when the sandbox mounts a
        scratch folder there; ``(cwd, extra bwrap_command keywords)``."""
        params = inspect.signature(sb.bwrap_command).parameters
        if "scratch" in params and hasattr(sb, "Scratch"):
            self._scratch = sb.Scratch(sb.default_scratch_parent())
            folder, cwd, extra = self._scratch.work, os.path.realpath(self.cwd), {"scratch": self._scratch.work}
        else:
            folder = cwd = tempfile.mkdtemp(prefix="rlhf-trusted-")
            self._scratch_dir, extra = folder, {}
        if uid >= 0:
            os.chown(folder, uid, uid)
        if "tmp_bytes" in params and hasattr(self.km, "tmp_limit_mb"):
            extra["tmp_bytes"] = int(self.km.tmp_limit_mb()) * sb._kernel_guard.MIB
        return cwd, extra

    def _library(self, sb) -> str:
        """The library the notebook's kernel sees (its build when the kernel is sandboxed)."""
        build = getattr(self.km, "_library_build", None)
        if build is not None and not getattr(self.km, "no_sandbox", False):
            return str(build(os.path.realpath(self.cwd)))
        return sb._installed_library_dir()

    # -- the pipe -------------------------------------------------------------------------------------
    def _ask(self, message: dict, timeout: float) -> dict:
        """Send ``message`` with a fresh token; the answer carrying that token (anything else the
        runtime's output holds before it is the notebook's doing, and is reported as such)."""
        token = secrets.token_hex(16)
        self._write(dict(message, token=token))
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(max(0.0, deadline - time.monotonic()))
            if reply.get("token") == token:
                return reply
            self._tampered.append("wrote into the grader's channel")

    def _write(self, message: dict) -> None:
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise RuntimeBroken(f"it stopped ({type(exc).__name__})") from None

    def _read(self, timeout: float) -> dict:
        """One JSON line from the runtime within ``timeout`` s (``TimeoutError``), at most :data:`MAX_LINE`."""
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = self._proc.poll()
                raise RuntimeBroken("it stopped" + (f" (exit status {code})" if code is not None else ""))
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                raise RuntimeBroken("its answer is too large")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            body = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self._tampered.append("wrote into the grader's channel")
            return {}
        return body if isinstance(body, dict) else {}


# --- one runtime per notebook being graded --------------------------------------------------------

def _who(path: str, executor) -> str:
    parts = os.path.normpath(path).split(os.sep)
    name = (getattr(executor, "resources", None) or {}).get("unique_key", "") if isinstance(
        getattr(executor, "resources", None), dict) else ""
    return "/".join(p for p in parts[-2:] + [str(name)] if p)


def uses_grad(grade_id: str) -> bool:
    """Does the check registered under ``grade_id`` ask for a gradient (its source calls ``.grad(``)?"""
    if grade_id not in _USES_GRAD:
        from rlhf_lab.judging import CHECKS

        spec = CHECKS.get(grade_id)
        try:
            _USES_GRAD[grade_id] = spec is not None and ".grad(" in inspect.getsource(spec.run)
        except (OSError, TypeError):
            _USES_GRAD[grade_id] = True
    return _USES_GRAD[grade_id]


_USES_GRAD: dict[str, bool] = {}


def grad_names(grade_id: str) -> list[str]:
    """The functions the check ``grade_id`` asks gradients of, where its source names them with a
    literal (``student.grad("masked_nll", ...)``); [] when it names none that way."""
    if grade_id not in _GRAD_NAMES:
        from rlhf_lab.judging import CHECKS

        spec, names = CHECKS.get(grade_id), []
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(spec.run))) if spec is not None else None
        except (OSError, TypeError, SyntaxError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "grad" \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and node.args[0].value not in names:
                names.append(node.args[0].value)
        _GRAD_NAMES[grade_id] = names
    return _GRAD_NAMES[grade_id]


_GRAD_NAMES: dict[str, list[str]] = {}


def _prefetch_first_check(runtime: "TrustedRuntime", start: int, judged_check) -> None:
    """Prefetch (:meth:`TrustedRuntime.prefetch`) the cells of the first gradient check at or below
    cell ``start`` that names its functions (:func:`grad_names`). A check before it that names none
    is passed over: ``uses_grad`` also counts a check whose text merely mentions ``.grad(``, and one
    that does ask, with a computed name, only costs a re-run when it needs an earlier cell."""
    for index in range(start, len(runtime.cells)):
        grade_id = judged_check(runtime.cells[index])
        if grade_id and uses_grad(grade_id):
            names = grad_names(grade_id)
            if names:
                runtime.prefetch(names, index)
                return


def _judged_ids(cells, start: int, judged_check) -> list[str]:
    return [n for n in (judged_check(c) for c in cells[start:]) if n]


def for_cell(executor, index: int, timeout: float, judged_check):
    """The :class:`TrustedRuntime` of the notebook ``executor`` (an nbgrader ``Execute`` with
    :class:`~.judge.JudgeCells`) is running, prepared for its test cell ``index``; ``None`` when
    disabled (:data:`ENABLE_ENV`). Its process starts at the first call for a notebook that has a
    gradient check at or below ``index`` (the judge calls this at the notebook's first cell, so JAX is
    imported while the kernel runs the notebook), is kept for the notebook's other requests, and is
    stopped when a new notebook (or kernel) starts.
    ``judged_check(cell)`` is the judge's reader of a test cell's grade id (passed in: this module sits
    below the judge)."""
    if not enabled():
        return None
    nb, km = getattr(executor, "nb", None), getattr(executor, "km", None)
    current = getattr(executor, "_rlhf_trusted_runtime", None)
    if current is not None and (current[0] is not nb or current[1] is not km):
        current[2].close()
        current = None
    if current is None:
        resources = getattr(executor, "resources", None) or {}
        path = (resources.get("metadata") or {}).get("path") or getattr(km, "_notebook_dir", None) or os.getcwd()
        runtime = TrustedRuntime((nb or {}).get("cells", []), os.path.abspath(path), timeout=timeout, km=km,
                                 who=_who(path, executor), log=getattr(executor, "log", None))
        current = (nb, km, runtime)
        executor._rlhf_trusted_runtime = current
    runtime = current[2]
    runtime.upto, runtime.timeout, runtime.cell_timeout = index, timeout, timeout
    if runtime._proc is None and any(uses_grad(n) for n in _judged_ids(runtime.cells, index, judged_check)):
        try:
            runtime.start()
            _prefetch_first_check(runtime, index, judged_check)
        except Exception as exc:  # noqa: BLE001 - the first gradient request reports it to the student
            runtime.close()
            if runtime.log is not None:
                runtime.log.warning("trusted gradient runtime for %s did not start: %s", runtime.who, exc)
    return runtime


def close_for(executor) -> None:
    """Stop the runtime of ``executor``'s last notebook (for the end of ``JudgeCells.preprocess``)."""
    current = getattr(executor, "_rlhf_trusted_runtime", None)
    if current is not None:
        current[2].close()
        executor._rlhf_trusted_runtime = None


@atexit.register
def _close_all() -> None:
    """Stop every runtime still running when the grader exits."""
    for runtime in list(_LIVE):
        runtime.close()

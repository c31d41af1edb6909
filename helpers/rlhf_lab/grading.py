"""Tamper-resistant primitives for the course's autograder tests.

Autograding runs student code in the same kernel as the tests, so a test that trusts names the
student can rebind (``np.testing.assert_allclose``, ``jax.grad``, ``float``, the library's own
functions, an object's ``__eq__``) can be fooled. This module is the defence used by every hidden
test:

* :func:`start` runs in each notebook's first, locked cell (nbgrader restores its source before
  autograding, so it always runs before any student code). It records the identity of every public
  attribute of the modules the tests rely on and loads a *private copy* of the library's reference
  implementations that student code cannot reach through ``rlhf_lab``.
* :func:`untampered` compares the current state with that snapshot and names what was replaced.
* :func:`call` first reads the student's function statically (its bytecode, globals, closures,
  defaults and wrappers, following every function of the notebook it reaches): if a forbidden
  library function is reachable from it, the task was delegated rather than implemented. It then
  runs the function under a profile hook; if any code of the library's reference implementations
  (or of the private copy) runs during the call, the task was delegated too. The static reading
  sees through ``jax.jit`` (whose cached traces skip the Python a hook could see); the hook sees
  through names built at run time (``getattr(module, "ppo_" + "loss")``).
* :func:`close`, :func:`equal` and :func:`check` make decisions with trusted NumPy and plain
  arithmetic on float64 copies, never with anything the student could have patched.

The module is a defence in depth, not a sandbox: a determined student can still attack the kernel
itself. The instructor pipeline adds a static integrity scan and README's "Security" section
explains how to run autograding of untrusted code in isolation.
"""
from __future__ import annotations

import builtins
import dis
import functools
import importlib.util
import math
import operator
import os
import sys
import types
import unittest
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

try:  # bound now, so a student who replaces IPython.get_ipython cannot hand the checks a fake namespace
    from IPython import get_ipython as _get_ipython
except Exception:  # pragma: no cover - IPython is always present in a kernel
    _get_ipython = None
import threading as _threading

__all__ = ["start", "untampered", "call", "close", "equal", "check", "rng", "reference", "GradingError", "judge"]


class GradingError(AssertionError):
    """Raised when a check fails; the message is written for the student."""


# Trusted private references, bound at import time of this module (before any student code, because
# the locked first cell imports it). Looked up through this module's globals, never the user's namespace.
_len = builtins.len
_isinstance = builtins.isinstance
_getattr = builtins.getattr
_id = builtins.id
_sorted = builtins.sorted
_setprofile = sys.setprofile
_getprofile = sys.getprofile
_settrace = sys.settrace
_get_instructions = dis.get_instructions
_partial = functools.partial
_sysconfig_paths = None  # filled lazily: folders of the standard library and installed packages
_urandom = os.urandom
_default_rng = np.random.default_rng

# Modules whose public attributes are snapshotted. A student cell that rebinds any of them (for
# example ``np.testing.assert_allclose = lambda *a, **k: None``) is reported by :func:`untampered`.
_WATCHED_MODULES = {
    "builtins": builtins,
    "math": math,
    "operator": operator,
    "numpy": np,
    "numpy.testing": np.testing,
    "numpy.random": np.random,
    "jax": jax,
    "jax.numpy": jnp,
    "jax.nn": jax.nn,
    "jax.lax": jax.lax,
    "jax.random": jax.random,
    "unittest": unittest,
    "sys": sys,
}
_WATCHED_CLASSES = {"unittest.TestCase": unittest.TestCase}
# Names in the notebook namespace that tests rely on; rebinding them is reported too.
_USER_NAMES = {"np": np, "jnp": jnp, "jax": jax}
_LIBRARY_MODULES = ("ppo", "reward", "trainer", "sweep", "lesson")
_SKIP_ATTRS = {"__dict__", "__doc__", "__loader__", "__spec__", "__builtins__", "__warningregistry__"}


class _State:
    """Everything :func:`start` records; kept out of the module namespace on purpose."""

    def __init__(self):
        self.snapshot: dict[tuple[str, str], int] = {}
        self.modules: dict[str, int] = {}
        self.library_codes: dict[types.CodeType, str] = {}
        self.reference_codes: dict[types.CodeType, str] = {}
        self.own: dict[str, int] = {}
        self.reference: types.SimpleNamespace | None = None
        # identity of every trusted reference function, its code and defaults, and of every global of
        # the private modules they run in (``grading.reference.f.__code__ = ...`` or
        # ``grading.reference.f.__globals__["jnp"] = ...`` would otherwise go unnoticed)
        self.reference_ids: dict[str, tuple] = {}
        self.private_globals: dict[str, tuple[dict, dict[str, int]]] = {}
        # code objects whose execution inside a student's function is tampering, not delegation
        self.tamper_codes: dict[types.CodeType, str] = {}
        # the private copy of rlhf_lab.judging (the checks hidden tests run) and each check's identity
        self.judging: types.ModuleType | None = None
        self.check_ids: dict[str, tuple] = {}


_STATE: _State | None = None


def _public_attrs(obj) -> dict[str, int]:
    out = {}
    for name, value in list(vars(obj).items()):
        if name in _SKIP_ATTRS or _isinstance(value, (int, float, str, bytes, tuple, frozenset, type(None))):
            continue
        if name in ("modules", "path", "meta_path", "path_hooks", "path_importer_cache", "argv", "ps1", "ps2",
                    "last_type", "last_value", "last_traceback", "last_exc", "stdout", "stderr", "displayhook",
                    "excepthook", "_", "input", "getpass", "breakpointhook", "unraisablehook"):
            continue  # legitimately changed by the interpreter / IPython
        out[name] = _id(value)
    return out


def _code_objects(module) -> dict[types.CodeType, str]:
    """All code objects of functions defined in ``module`` (including nested functions)."""
    found: dict[types.CodeType, str] = {}

    def walk(code: types.CodeType, qual: str):
        found[code] = qual
        for const in code.co_consts:
            if _isinstance(const, types.CodeType):
                walk(const, f"{qual}.{const.co_name}")

    for name, value in vars(module).items():
        fn = getattr(value, "__wrapped__", value)
        if _isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__:
            walk(fn.__code__, f"{module.__name__}.{name}")
    return found


def _load_private(modname: str, alias: str):
    """Load ``rlhf_lab.<modname>`` from its file under a private name (a fresh copy of the code)."""
    path = Path(__file__).with_name(f"{modname}.py")
    spec = importlib.util.spec_from_file_location(f"rlhf_lab.{modname}", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "rlhf_lab"
    spec.loader.exec_module(module)
    module.__name__ = alias
    return module


def _load_private_package(subpackage: str, alias: str) -> dict:
    """Load the package ``rlhf_lab.<subpackage>`` from its folder under a private name.

    Its modules import each other relatively, so they are loaded as ``<alias>.<module>`` and then
    taken out of ``sys.modules`` again (they keep their references to each other): student code
    finds them neither under ``rlhf_lab`` nor under the private name. Returns ``{name: module}``.
    """
    folder = Path(__file__).with_name(subpackage)
    spec = importlib.util.spec_from_file_location(alias, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[alias] = package
    try:
        spec.loader.exec_module(package)
        return {name: module for name, module in sys.modules.items() if name == alias or name.startswith(alias + ".")}
    finally:
        for name in [n for n in sys.modules if n == alias or n.startswith(alias + ".")]:
            del sys.modules[name]


def start() -> None:
    """Snapshot trusted state. Call once in the first (locked) cell of every notebook; idempotent."""
    global _STATE, reference
    if _STATE is not None:
        return
    import rlhf_lab  # noqa: F401  (make sure the real library is loaded before we record it)

    state = _State()
    for label, module in _WATCHED_MODULES.items():
        for name, ident in _public_attrs(module).items():
            state.snapshot[(label, name)] = ident
    for label, cls in _WATCHED_CLASSES.items():
        for name, ident in _public_attrs(cls).items():
            state.snapshot[(label, name)] = ident
    for modname in _LIBRARY_MODULES:
        lib = sys.modules.get(f"rlhf_lab.{modname}") or importlib.import_module(f"rlhf_lab.{modname}")
        state.library_codes.update(_code_objects(lib))
        for name, ident in _public_attrs(lib).items():
            state.snapshot[(f"rlhf_lab.{modname}", name)] = ident
    for name, ident in _public_attrs(sys.modules["rlhf_lab"]).items():
        state.snapshot[("rlhf_lab", name)] = ident
    for name in ("numpy", "numpy.testing", "jax", "jax.numpy", "rlhf_lab", "rlhf_lab.ppo", __name__):
        state.modules[name] = _id(sys.modules[name])
    this = sys.modules[__name__]
    state.own = {name: _id(getattr(this, name)) for name in __all__ if name != "reference"}

    private_ppo = _load_private("ppo", "_rlhf_trusted_ppo")
    private_reward = _load_private("reward", "_rlhf_trusted_reward")
    state.reference_codes.update(_code_objects(private_ppo))
    state.reference_codes.update(_code_objects(private_reward))
    state.reference = types.SimpleNamespace(
        **{n: getattr(private_ppo, n) for n in dir(private_ppo) if not n.startswith("_")
           and _isinstance(getattr(private_ppo, n), types.FunctionType)},
        # (a library build without a task's reference, such as a student's, lacks some of them)
        **{n: getattr(private_reward, n) for n in ("preference_loss", "fit_reward") if hasattr(private_reward, n)},
    )
    for name, fn in vars(state.reference).items():
        state.reference_ids[name] = _fingerprint(fn)
    for label, module in (("ppo", private_ppo), ("reward", private_reward)):
        namespace = vars(module)
        state.private_globals[label] = (namespace, {k: _id(v) for k, v in namespace.items()
                                                     if k not in _SKIP_ATTRS})
    state.own["reference"] = _id(state.reference)
    # the hidden tests' checks (rlhf_lab.judging), a private copy too
    # (absent from the library build a sandboxed grading kernel sees: there the judge decides outside)
    if Path(__file__).with_name("judging").is_dir():
        judging = _load_private_package("judging", "_rlhf_trusted_judging")
        state.judging = judging["_rlhf_trusted_judging"]
        for name, module in judging.items():  # (not forbidden: it is the grader's own code, never the student's)
            namespace = vars(module)
            state.private_globals[name] = (namespace, {k: _id(v) for k, v in namespace.items()
                                                       if k not in _SKIP_ATTRS})
        state.check_ids = {name: _fingerprint(spec.run) for name, spec in state.judging.CHECKS.items()}
    for fn, label in ((_threading.setprofile, "threading.setprofile"), (_threading.settrace, "threading.settrace")):
        code = _getattr(fn, "__code__", None)
        if code is not None:
            state.tamper_codes[code] = label
    reference = state.reference
    _STATE = state


def _fingerprint(fn) -> tuple:
    """Identity of a function and of the parts a student could swap without replacing it."""
    return (_id(fn), _id(_getattr(fn, "__code__", None)), _id(_getattr(fn, "__defaults__", None)),
            _id(_getattr(fn, "__kwdefaults__", None)), _id(_getattr(fn, "__wrapped__", None)))


#: Trusted reference implementations (a private copy of :mod:`rlhf_lab.ppo` and :mod:`rlhf_lab.reward`),
#: available after :func:`start`.
reference: types.SimpleNamespace | None = None


def _state() -> _State:
    if _STATE is None:
        raise GradingError(
            "grading.start() has not run: restart the kernel and run the notebook from the first cell"
        )
    return _STATE


def _user_ns() -> dict | None:
    if _get_ipython is None:  # pragma: no cover - IPython is always present in a kernel
        return None
    shell = _get_ipython()
    return None if shell is None else shell.user_ns


def tampering_report() -> list[str]:
    """List every snapshotted object that no longer is what :func:`start` recorded."""
    state = _state()
    problems: list[str] = []
    for label, module in _WATCHED_MODULES.items():
        current = vars(module)
        for (lab, name), ident in state.snapshot.items():
            if lab == label and (name not in current or _id(current[name]) != ident):
                problems.append(f"{label}.{name}")
    for label, cls in _WATCHED_CLASSES.items():
        current = vars(cls)
        for (lab, name), ident in state.snapshot.items():
            if lab == label and (name not in current or _id(current[name]) != ident):
                problems.append(f"{label}.{name}")
    for (lab, name), ident in state.snapshot.items():
        if lab.startswith("rlhf_lab"):
            module = sys.modules.get(lab)
            if module is None or _id(vars(module).get(name)) != ident:
                problems.append(f"{lab}.{name}")
    for name, ident in state.modules.items():
        if _id(sys.modules.get(name)) != ident:
            problems.append(f"sys.modules[{name!r}]")
    this = sys.modules.get(__name__)
    for name, ident in state.own.items():
        if this is None or _id(vars(this).get(name)) != ident:
            problems.append(f"grading.{name}")
    if this is not None and _GUARD_CLASS and type(this) is not _GUARD_CLASS[0]:
        problems.append("the grading module's class (its protection was removed)")
    current_ref = vars(this).get("reference") if this is not None else None
    if current_ref is not state.reference:
        problems.append("grading.reference")
    for name, fingerprint in state.reference_ids.items():
        fn = vars(state.reference).get(name)
        if fn is None or _fingerprint(fn) != fingerprint:
            problems.append(f"grading.reference.{name}")
    if _sorted(vars(state.reference)) != _sorted(state.reference_ids):
        problems.append("grading.reference (names added or removed)")
    for label, (namespace, ids) in state.private_globals.items():
        for name, ident in ids.items():
            if _id(namespace.get(name)) != ident:
                problems.append(f"a global of the trusted reference copy ({label}.{name})")
    checks = state.judging.CHECKS if state.judging is not None else {}
    for name, fingerprint in state.check_ids.items():
        spec = checks.get(name)
        if spec is None or _fingerprint(spec.run) != fingerprint:
            problems.append(f"the hidden test's check {name!r}")
    user_ns = _user_ns()
    if user_ns is not None:
        for name, obj in _USER_NAMES.items():
            if name in user_ns and user_ns[name] is not obj:
                problems.append(f"the notebook name {name!r}")
        for name in ("float", "int", "bool", "abs", "len", "isinstance", "AssertionError", "print", "range", "sum",
                     "min", "max", "round"):
            if name in user_ns and user_ns[name] is not _getattr(builtins, name):
                problems.append(f"the built-in {name!r} (shadowed in the notebook)")
        if "grading" in user_ns and user_ns["grading"] is not this:
            problems.append("the notebook name 'grading'")
    return _sorted(set(problems))


def untampered() -> None:
    """Raise :class:`GradingError` naming anything the notebook replaced that the tests rely on."""
    problems = tampering_report()
    if problems:
        shown = ", ".join(problems[:8]) + (" ..." if _len(problems) > 8 else "")
        raise GradingError(
            "tampering detected: code in this notebook replaced " + shown
            + ". Tests cannot trust a kernel where these were rebound; restore them (restart the kernel "
            "and remove the reassignment) to be graded."
        )


def rng(tag: str = "") -> np.random.Generator:
    """A NumPy generator seeded from the OS at call time: fresh inputs on every grading run."""
    seed = int.from_bytes(_urandom(8), "little")
    SEEDS[tag] = seed
    return _default_rng(seed)


#: The seed of the latest :func:`rng` call per tag (to reproduce a failing fresh input).
SEEDS: dict[str, int] = {}


def _core():
    """The private copy of :mod:`rlhf_lab.judging.core` loaded by :func:`start` (it decides every comparison)."""
    state = _state()
    if state.judging is None:
        raise GradingError("grading primitives are not available in this kernel (the grader decides outside it)")
    return state.judging.core


def _decided(fn, *args, **kwargs):
    """Run a decision of the private judging core; its failures become this module's :class:`GradingError`."""
    core = _core()
    try:
        return fn(*args, **kwargs)
    except core.GradingError as exc:
        raise GradingError(str(exc)) from None


def _to_float_array(value, what: str) -> np.ndarray:
    """Convert an answer to a float64 array with trusted NumPy; non-numeric answers fail."""
    return _decided(_core().to_float, value, what)


def _hook_for(forbidden: dict[types.CodeType, str], hits: list[str], tampered: list[str] | None = None,
              tamper_codes: dict | None = None, armed: list | None = None):
    """The profile function used by :func:`call_raw`.

    ``call`` events of forbidden code record delegation in ``hits``. A ``c_call`` of
    ``sys.setprofile``/``sys.settrace`` (or a call of ``threading.setprofile``/``settrace``) while
    ``armed`` records tampering: a student function that switched the hook off around a call to
    the library and back on again would otherwise hide the delegation.
    """
    tamper_codes = tamper_codes or {}

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            name = forbidden.get(code)
            if name is not None:
                hits.append(name)
            elif tampered is not None and code in tamper_codes:
                tampered.append(tamper_codes[code])
        elif event == "c_call" and tampered is not None and (arg is _setprofile or arg is _settrace):
            if armed is None or armed[0]:
                tampered.append("sys.setprofile" if arg is _setprofile else "sys.settrace")

    return hook


def call(fn, *args, task: str, forbid=(), **kwargs):
    """Call a student's function for ``task`` and return its result converted to a float64 array.

    Two checks decide whether the task was delegated to a forbidden library function
    (``rlhf_lab.<module>.<name>`` for ``name`` in ``forbid``, or any function of the private
    reference copy), and each raises :class:`GradingError` naming it:

    * statically, before the call: :func:`_reachable_forbidden` reads the function and everything
      of the notebook it reaches (see there); this is what catches a ``jax.jit`` wrapper whose
      trace was cached by an earlier call, since a cache hit runs no Python at all;
    * dynamically, during the call and the conversion of its result: a profile hook records every
      Python function that starts; forbidden code starting means delegation.

    JIT stays on, so a student's compiled training loop costs what it costs in the notebook.

    Args:
      fn: the student's function.
      *args, **kwargs: its inputs (fresh arrays made by the test).
      task: the task's name, used in messages.
      forbid: names of library functions the student must not call for this task (``"*"`` forbids all).

    Returns:
      The result as a float64 NumPy array (tuples/lists become arrays; use :func:`call_raw` for more).
    """
    result = call_raw(fn, *args, task=task, forbid=forbid, **kwargs)
    return result


def call_raw(fn, *args, task: str, forbid=(), convert=True, **kwargs):
    """Like :func:`call`; with ``convert=False`` the raw result is returned (still checked for delegation)."""
    untampered()
    state = _state()
    forbidden = _forbidden_codes(state, forbid)
    _static_delegation_check(fn, task, forbidden, args, kwargs)
    hits: list[str] = []
    tampered: list[str] = []
    armed = [True]
    hook = _hook_for(forbidden, hits, tampered, state.tamper_codes, armed)
    previous = _getprofile()
    _setprofile(hook)
    try:
        try:
            out = fn(*args, **kwargs)
        except GradingError:
            raise
        except Exception as exc:  # noqa: BLE001 - report the student's error clearly
            raise GradingError(f"{task}: your function raised {type(exc).__name__}: {exc}") from None
        if convert:
            out = _to_float_array(out, f"{task} result")
        still_ours = _getprofile() is hook
    finally:
        armed[0] = False
        _setprofile(previous)
    if not still_ours or tampered:
        what = tampered[0] if tampered else "sys.setprofile"
        raise GradingError(f"{task}: tampering detected: your function called {what}, switching off the profiler "
                           "the grader uses to check that the task is implemented, not delegated")
    if hits:
        raise GradingError(_delegated(task, hits[0]))
    untampered()
    return out


def _forbidden_codes(state: _State, forbid) -> dict:
    """Code objects the student's function must not run: the private references and the ``forbid`` names."""
    forbidden = dict(state.reference_codes)
    for code, qual in state.library_codes.items():
        short = qual.split(".")[2] if qual.count(".") >= 2 else qual
        if "*" in forbid or short in forbid:
            forbidden[code] = qual
    return forbidden


def _static_delegation_check(fn, task: str, forbidden: dict, args: tuple = (), kwargs: dict | None = None) -> None:
    """Fail the task when a forbidden library function is reachable from ``fn`` (read, not run)."""
    if not callable(fn):
        raise GradingError(f"{task}: expected a function, got {type(fn).__name__}")
    reached = _reachable_forbidden(fn, forbidden, _passed_names(fn, args, kwargs or {}))
    if reached is not None:
        raise GradingError(_delegated(task, reached, "is used by"))


def _delegated(task: str, qual: str, how: str = "ran inside") -> str:
    name = qual.replace("_rlhf_trusted_", "rlhf_lab.")
    return (
        f"{task}: this task must be implemented, not delegated to the course library "
        f"({name} {how} your function). Write the computation yourself; the library is given code "
        f"only in later notebooks."
    )


def _passed_names(fn, args: tuple, kwargs: dict) -> frozenset:
    """Names of ``fn``'s parameters that a call with ``args``/``kwargs`` supplies."""
    code = _getattr(_wrap_chain(fn)[-1], "__code__", None)
    if code is None:
        return frozenset(kwargs)
    positional = code.co_varnames[:code.co_argcount]
    return frozenset(positional[:_len(args)]) | frozenset(kwargs)


def _wrapped(obj):
    """What ``obj`` wraps (``__wrapped__`` of ``functools.wraps``/``jax.jit``), or ``_MISSING``.

    Read from the instance ``__dict__`` (no student ``__getattr__`` runs); JAX's C++ wrappers are
    asked by attribute."""
    try:
        inner = object.__getattribute__(obj, "__dict__").get("__wrapped__", _MISSING)
    except Exception:  # noqa: BLE001 - no __dict__
        inner = _MISSING
    if inner is _MISSING and type(obj).__module__.startswith("jax"):
        try:
            inner = _getattr(obj, "__wrapped__", _MISSING)
        except Exception:  # noqa: BLE001
            inner = _MISSING
    return inner


def _wrap_chain(fn, depth: int = 8) -> list:
    """``fn`` and what it wraps, outermost first (at most ``depth`` levels)."""
    chain = [fn]
    while _len(chain) < depth:
        inner = _wrapped(chain[-1])
        if inner is _MISSING or inner is None:
            break
        chain.append(inner)
    return chain


def _is_installed_code(fn) -> bool:
    """True for functions of the standard library or of installed packages other than the course's.

    Their code is not read (JAX and NumPy are large and cannot reach the course library); the
    course library itself (``rlhf_lab``, editable or installed) and notebook code always are.
    """
    global _sysconfig_paths
    module = _getattr(fn, "__module__", None) or ""
    if module.split(".")[0] in ("rlhf_lab", "__main__") or module.startswith("_rlhf_trusted_"):
        return False
    code = _getattr(fn, "__code__", None)
    filename = _getattr(code, "co_filename", "") or ""
    if _sysconfig_paths is None:
        import sysconfig
        _sysconfig_paths = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    return filename.startswith(_sysconfig_paths)


def _attr_static(obj, name: str):
    """``obj.name`` for modules and plain namespaces only, without running any ``__getattr__``."""
    if _isinstance(obj, (types.ModuleType, types.SimpleNamespace)):
        try:
            return object.__getattribute__(obj, "__dict__").get(name, _MISSING)
        except Exception:  # noqa: BLE001 - a hostile object: nothing to follow
            return _MISSING
    return _MISSING


_MISSING = object()
_LOAD_NAME_OPS = {"LOAD_GLOBAL", "LOAD_NAME"}
_ATTR_OPS = {"LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM"}
_DEREF_OPS = {"LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE"}


def _references(fn, passed: frozenset = frozenset()) -> list:
    """Objects a Python function's code can reach by name: globals and attribute chains from them
    (``rlhf_lab.ppo.ppo_loss``), imports inside the body, closure cells, defaults. Nested functions
    and lambdas (code constants) are read too, against the same globals.

    ``passed`` names parameters the call supplies: their defaults are not reached (a test that
    passes ``surrogate=trusted`` replaces a default ``surrogate=ppo_surrogate``)."""
    found: list = []
    globals_ = _getattr(fn, "__globals__", None) or {}
    builtins_ns = vars(builtins)
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    for cell in cells.values():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    code0 = fn.__code__
    defaults = _getattr(fn, "__defaults__", None) or ()
    positional = code0.co_varnames[:code0.co_argcount]
    found.extend(value for name, value in zip(positional[_len(positional) - _len(defaults):], defaults)
                 if name not in passed)
    found.extend(value for name, value in (_getattr(fn, "__kwdefaults__", None) or {}).items()
                 if name not in passed)
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes.extend(c for c in code.co_consts if _isinstance(c, types.CodeType))
        current = _MISSING
        for ins in _get_instructions(code):
            op = ins.opname
            if op in _LOAD_NAME_OPS:
                name = ins.argval
                current = globals_.get(name, builtins_ns.get(name, _MISSING))
            elif op in _DEREF_OPS and code is fn.__code__ and ins.argval in cells:
                try:
                    current = cells[ins.argval].cell_contents
                except ValueError:
                    current = _MISSING
            elif op == "IMPORT_NAME":
                module = sys.modules.get(ins.argval, _MISSING)
                current = module
            elif op in _ATTR_OPS and current is not _MISSING:
                current = _attr_static(current, ins.argval)
            else:
                current = _MISSING
                continue
            if current is not _MISSING:
                found.append(current)
    return found


def _reachable_forbidden(fn, forbidden: dict[types.CodeType, str], passed: frozenset = frozenset(),
                         limit: int = 5000) -> str | None:
    """The name of a forbidden function reachable from ``fn`` without running it, or None.

    Followed: ``__wrapped__`` (``jax.jit``, ``functools.wraps``), ``functools.partial``, bound
    methods, callable instances of notebook classes, containers (dict, list, tuple, set,
    SimpleNamespace) and, for every Python function that is not installed code (see
    :func:`_is_installed_code`), everything :func:`_references` finds in its code. A function
    counts as forbidden when its code object is one of ``forbidden``'s, however it was imported
    or renamed. ``passed``: parameter names the call supplies (see :func:`_references`), applied
    to ``fn`` and the functions it wraps. Bounded by ``limit`` objects; cycles are visited once.
    """
    seen: set[int] = set()
    top = {_id(o) for o in _wrap_chain(fn)}  # fn and what it wraps: the call's own parameters
    stack = [fn]
    while stack and _len(seen) < limit:
        obj = stack.pop()
        if _id(obj) in seen or _isinstance(obj, (type(None), bool, int, float, complex, str, bytes,
                                                 np.ndarray, jax.Array, types.ModuleType)):
            continue
        seen.add(_id(obj))
        wrapped = _wrapped(obj)
        if wrapped is not _MISSING:
            stack.append(wrapped)
        if _isinstance(obj, types.FunctionType):
            name = forbidden.get(obj.__code__)
            if name is not None:
                return name
            if not _is_installed_code(obj):
                stack.extend(_references(obj, passed if _id(obj) in top else frozenset()))
        elif _isinstance(obj, types.MethodType):
            stack.extend((obj.__func__, obj.__self__))
        elif _isinstance(obj, _partial):
            stack.append(obj.func)
            stack.extend(obj.args)
            stack.extend(obj.keywords.values())
        elif _isinstance(obj, dict):
            stack.extend(list(obj.values())[:limit])
        elif _isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(list(obj)[:limit])
        elif _isinstance(obj, types.SimpleNamespace):
            stack.extend(vars(obj).values())
        elif _isinstance(obj, type):
            if obj.__module__ == "__main__":
                stack.extend(v for v in vars(obj).values() if _isinstance(v, (types.FunctionType, staticmethod,
                                                                                 classmethod)))
        elif _isinstance(obj, (staticmethod, classmethod)):
            stack.append(obj.__func__)
        elif type(obj).__module__ == "__main__":  # an instance of a notebook class: its methods and state
            stack.append(type(obj))
            try:
                stack.extend(object.__getattribute__(obj, "__dict__").values())
            except Exception:  # noqa: BLE001
                pass
    return None


class _KernelStudent:
    """The judging vocabulary (:class:`rlhf_lab.judging.core.Student`) inside the student's kernel.

    Every function of the notebook is called through :func:`call_raw` (delegation and tampering
    checks), every result is turned into plain data before a check sees it.
    """

    def __init__(self, namespace: dict, spec, core):
        self._ns, self._spec, self._core = namespace, spec, core

    def _fn(self, name: str):
        if name not in self._ns:
            raise GradingError(f"{self._spec.task}: `{name}` is not defined: run the cell that defines it "
                               "(restart the kernel and run the notebook from the top)")
        return self._ns[name]

    def _run(self, fn, args, kwargs, task: str, what: str):
        core = self._core
        args = core.materialise(tuple(args))
        kwargs = core.materialise(dict(kwargs))
        out = call_raw(fn, *args, task=task, forbid=self._spec.forbid, convert=False, **kwargs)
        return core.plain(out, what)

    def call(self, name: str, *args, **kwargs):
        return self._run(self._fn(name), args, kwargs, name, f"{name}: its result")

    def grad(self, name: str, argnums, *args, **kwargs):
        fn = jax.grad(self._fn(name), argnums=argnums)
        return self._run(fn, args, kwargs, name, f"{name}: its gradient")

    def value(self, name: str):
        return self._core.plain(self._fn(name), f"{self._spec.task}: {name}")

    def scenario(self, source, needs, *args, **kwargs):
        procedure = source.build()
        students = {n: self._fn(n) for n in needs}
        forbidden = _forbidden_codes(_state(), self._spec.forbid)
        for n, fn in students.items():
            _static_delegation_check(fn, n, forbidden)
        core = self._core
        args = core.materialise(tuple(args))
        kwargs = core.materialise(dict(kwargs))
        spec = self._spec
        # the procedure runs the student's functions; all of it is watched like one call
        out = call_raw(lambda: procedure(*args, **students, **kwargs), task=spec.task, forbid=spec.forbid,
                       convert=False)
        return core.plain(out, f"{spec.task}: {source.name}")


def judge(name: str) -> None:
    """Run the check of the test cell ``name`` (:data:`rlhf_lab.judging.CHECKS`) on this notebook.

    The hidden region of every test cell is this one call. The check draws fresh inputs from
    :func:`rng`, asks the notebook's functions for their outputs, computes the expected values with
    the private reference copy and raises :class:`GradingError` with a message for the student.
    """
    untampered()
    state = _state()
    if state.judging is None:
        raise GradingError("the hidden tests are decided by the grader, outside this kernel (this kernel's "
                           "course library has no checks)")
    spec = state.judging.CHECKS.get(name)
    if spec is None:
        raise GradingError(f"no check is registered for the test cell {name!r} (course library out of date?)")
    namespace = _user_ns()
    if namespace is None:  # pragma: no cover - always in a kernel
        raise GradingError("grading.judge runs in a notebook kernel")
    core = state.judging.core
    try:
        spec.run(_KernelStudent(namespace, spec, core), rng(name), state.reference)
    except core.GradingError as exc:
        raise GradingError(str(exc)) from None
    untampered()


def close(actual, expected, what: str, hint: str = "", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Assert ``|actual - expected| <= atol + rtol |expected|`` elementwise, with trusted arithmetic.

    Shapes must match exactly and every entry must be finite. ``hint`` is appended to the message.
    """
    untampered()
    _decided(_core().close, actual, expected, what, hint=hint, rtol=rtol, atol=atol)


def equal(actual, expected, what: str, hint: str = "") -> None:
    """Assert exact equality of numeric values (same shape, identical float64 entries)."""
    untampered()
    _decided(_core().equal, actual, expected, what, hint=hint)


def matches(actual, expected, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """True when ``actual`` is numerically close to ``expected`` (for diagnosing *which* mistake was made)."""
    return _core().matches(actual, expected, rtol=rtol, atol=atol)


def check(condition, message: str) -> None:
    """Trusted ``assert``: raise :class:`GradingError` with ``message`` unless ``condition`` holds.

    ``condition`` must be a real ``bool``/NumPy bool (an object with a custom ``__bool__`` is rejected).
    """
    untampered()
    _decided(_core().check, condition, message)


__all__ += ["call_raw", "matches", "tampering_report"]


def _guard_module() -> None:
    """Make ``grading.<public name>`` always resolve to the real primitive.

    A student cell can write ``grading.close = lambda *a, **k: None``; if the hidden tests then
    looked ``close`` up on the module they would call the student's function and no trusted code
    would ever run. The module's class is switched to a :class:`types.ModuleType` subclass whose
    attribute lookup returns the originals (captured here, in a closure) for the public API, so
    the tests keep calling the real primitives, and those report the write as tampering
    (:func:`tampering_report` compares the module's ``__dict__`` with :func:`start`'s snapshot).
    Assignments still succeed (nothing in a student's cell raises), they just cannot take effect.
    Swapping the class back, writing ``sys.modules`` or rebinding the name ``grading`` itself
    are caught by :func:`tampering_report` when they matter and are blocked before grading by
    the instructor pipeline's static integrity scan.
    """
    module = sys.modules[__name__]
    trusted = {name: vars(module)[name] for name in __all__ if name in vars(module) and name != "reference"}
    trusted_state = _state_ref

    class _GuardedModule(types.ModuleType):
        def __getattribute__(self, name):
            if name in trusted:
                return trusted[name]
            if name == "reference":
                state = trusted_state()
                return state.reference if state is not None else None
            return super().__getattribute__(name)

    module.__class__ = _GuardedModule
    _GUARD_CLASS.append(_GuardedModule)


def _state_ref():
    return _STATE


_GUARD_CLASS: list = []
_guard_module()

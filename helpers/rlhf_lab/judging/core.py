"""The judge's vocabulary: how a check talks to a student's code, and how it decides.

A hidden test is a *check*: ordinary library code that generates fresh inputs, asks the student's
code for outputs, computes the expected values itself, compares and, when they differ, names the
classic mistake the outputs match. A check never touches a student object directly: everything it
learns comes through a :class:`Student`, as plain data (NumPy arrays, numbers, booleans, ``None``,
and tuples, lists and string-keyed dicts of them, see :func:`plain`). The same check therefore runs

* in a grader process outside the kernel (every grade), with a :class:`Student` that sends each
  request to the kernel and receives plain data back, and
* in a kernel of the instructor's (a source notebook, the compile-cache seed build), where
  :func:`rlhf_lab.grading.judge` uses :class:`LocalStudent` to call the notebook's functions in place.

What a check may ask a :class:`Student` for:

``call(name, *args, **kwargs)``
    the result of the notebook's function ``name`` on these inputs;
``grad(name, argnums, *args, **kwargs)``
    ``jax.grad(name, argnums)(*args, **kwargs)``, computed by the judge from the program the
    function traces to on the student's side (:mod:`rlhf_lab.judging.program`);
``value(name)``
    a value the notebook computed (a number, an array, a dict of arrays);
``scenario(source, needs, *args, **kwargs)``
    the result of the function defined by ``source`` (trusted code written by the check, run on
    the student's side) called with the student's functions ``needs`` as keyword arguments, for
    procedures such as "call it, then update its input in place, then look at the result".

Arguments are plain data too, plus :class:`Jax` (an array to pass as a JAX array), :class:`Key`
(a JAX PRNG key, rebuilt from its seed where the call runs) and :class:`Source` (a function
written by the check, rebuilt from its source where the call runs, such as a trusted
``surrogate`` handed to a student's sweep). :func:`materialise` turns them into the objects the
student's function receives.

The comparison helpers (:func:`close`, :func:`equal`, :func:`matches`, :func:`check`,
:func:`diagnose`) convert with NumPy to float64 before deciding, so an answer object with a
custom ``__eq__`` or ``__bool__`` decides nothing.
"""
from __future__ import annotations

import builtins
import types
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

# Bound at import time (the grader imports this module before any student code runs).
_asarray = np.asarray
_float64 = np.float64
_isfinite = np.isfinite
_abs = np.abs
_array_equal = np.array_equal
_all = np.all
_any = np.any
_bool = builtins.bool
_float = builtins.float
_isinstance = builtins.isinstance
_repr = builtins.repr
_type = builtins.type


from .errors import GradingError  # noqa: E402 - re-exported: the checks' vocabulary


@dataclass(frozen=True)
class Key:
    """A JAX PRNG key, ``jax.random.key(seed)``, rebuilt where the call runs."""

    seed: int


@dataclass(frozen=True, eq=False)
class Jax:
    """An array handed to the student's function as a JAX array (``jnp.asarray``) rather than NumPy."""

    value: Any


@dataclass(frozen=True)
class Source:
    """A function written by a check: ``source`` defines ``name`` (with ``jax``, ``jnp``, ``np`` in scope)."""

    source: str
    name: str

    def build(self) -> Callable:
        """Execute the source in a fresh namespace and return the function it defines."""
        import jax
        import jax.numpy as jnp

        namespace: dict = {"jax": jax, "jnp": jnp, "np": np, "__name__": f"judge_source_{self.name}"}
        exec(compile(self.source, f"<check source {self.name}>", "exec"), namespace)  # noqa: S102 - trusted
        return namespace[self.name]


def materialise(value, built: dict | None = None):
    """The object a student's function receives for an argument (see :class:`Jax`, :class:`Key`, :class:`Source`).

    A :class:`Source` is built afresh, or, when ``built`` is a dict, once per source into it (for a
    caller that runs one student's code many times and wants one compiled function throughout).
    """
    if _isinstance(value, Jax):
        import jax.numpy as jnp

        return jnp.asarray(value.value)
    if _isinstance(value, Key):
        import jax

        return jax.random.key(value.seed)
    if _isinstance(value, Source):
        if built is None:
            return value.build()
        if value not in built:
            built[value] = value.build()
        return built[value]
    if _type(value) is np.ndarray:
        return value.copy()  # the student's code may write into its inputs; the check's stay intact
    if _type(value) in (tuple, list):
        return _type(value)(materialise(v, built) for v in value)
    if _type(value) is dict:
        return {k: materialise(v, built) for k, v in value.items()}
    return value


def untraceable_message(task: str, error: str) -> str:
    """The failure of a gradient check whose function JAX could not trace."""
    return (f"{task}: the grader differentiates your function with jax.grad, and JAX could not trace it "
            f"({error[:400]}). Compute it with jax.numpy operations on the inputs: no NumPy calls, float() "
            "or Python `if` on array values")


def unwrap(args) -> tuple:
    """The check's arguments with each :class:`Jax` marker replaced by its array (what a gradient check's
    rebuilt program is evaluated on)."""
    return tuple(a.value if _isinstance(a, Jax) else a for a in args)


class Student(Protocol):
    """What a check may ask of the student's code (see the module docstring)."""

    def call(self, name: str, *args, **kwargs) -> Any: ...

    def grad(self, name: str, argnums, *args, **kwargs) -> Any: ...

    def value(self, name: str) -> Any: ...

    def scenario(self, source: Source, needs: tuple, *args, **kwargs) -> Any: ...


class LocalStudent:
    """A :class:`Student` over a plain namespace of functions and values, in this process.

    For unit tests of the checks and for instructors trying a check on a solution outside a
    notebook; it runs the functions directly (no delegation or tampering checks).
    """

    #: Sources built once per student (see :func:`materialise`); None builds them at every call.
    built: dict | None = None

    def __init__(self, namespace: dict):
        self.namespace = namespace

    def _get(self, name: str):
        if name not in self.namespace:
            raise GradingError(f"`{name}` is not defined")
        return self.namespace[name]

    def call(self, name, *args, **kwargs):
        return plain(self._get(name)(*materialise(args, self.built), **materialise(kwargs, self.built)),
                     f"{name}: its result")

    def grad(self, name, argnums, *args, **kwargs):
        """As the judge computes it: the function traced to a program here (as the kernel does), the
        program sent through the wire's encoding and rebuilt and differentiated by
        :func:`rlhf_lab.judging.program.judge_gradient`."""
        import json

        from . import program, wire

        try:
            value, body = wire.trace(self._get(name), argnums, materialise(args, self.built),
                                     materialise(kwargs, self.built))
        except wire.Untraceable as exc:
            raise GradingError(untraceable_message(name, str(exc))) from None
        body = json.loads(json.dumps(body))  # plain JSON data, as it crosses the wire
        return program.judge_gradient(name, plain(value, f"{name}: its result"), body, unwrap(args), argnums)

    def value(self, name):
        return plain(self._get(name), name)

    def scenario(self, source, needs, *args, **kwargs):
        students = {n: self._get(n) for n in needs}
        return plain(source.build()(*materialise(args, self.built), **students, **materialise(kwargs, self.built)),
                     source.name)


# ------------------------------------------------------------------------------------------------
# plain data


def plain(value, what: str = "the result", depth: int = 0):
    """``value`` as plain data, or :class:`GradingError` naming what was returned instead.

    Plain data: ``None``, ``bool``, ``int``, ``float``, ``str`` (short), numeric NumPy arrays and
    scalars, JAX arrays (converted to NumPy), JAX PRNG keys (converted to their key data), and
    tuples, lists and ``str``-keyed dicts of plain data. Anything else (an object with custom
    comparison methods, a function, a generator) is refused: its behaviour could not be trusted.
    """
    if depth > 8:
        raise GradingError(f"{what}: nested too deeply")
    kind = _type(value)
    if value is None or kind in (bool, int, float, np.bool_):
        return value
    if kind is str:
        if len(value) > 10_000:
            raise GradingError(f"{what}: a text of {len(value)} characters")
        return value
    if kind in (tuple, list):
        return kind(plain(v, f"{what}[{i}]", depth + 1) for i, v in enumerate(value))
    if kind is dict:
        out = {}
        for k, v in value.items():
            if _type(k) is not str:
                raise GradingError(f"{what}: dict keys must be strings, got {_type(k).__name__}")
            out[k] = plain(v, f"{what}[{k!r}]", depth + 1)
        return out
    if _isinstance(value, np.generic) and kind.__module__ == "numpy":
        arr = np.array(value)
        if arr.dtype.kind not in "biuf":
            raise GradingError(f"{what}: a NumPy value of dtype {arr.dtype} is not a number")
        return arr[()]
    if kind is np.ndarray:
        if value.dtype.kind not in "biuf":
            raise GradingError(f"{what}: an array of dtype {value.dtype} is not numeric")
        return value.copy()
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("jax") or module.startswith("jaxlib"):
        import jax

        try:
            if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
                value = jax.random.key_data(value)
            arr = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - a tracer or a broken array is the answer's problem
            raise GradingError(f"{what}: a JAX value that cannot be read ({_type(exc).__name__}: {exc})") from None
        if arr.dtype.kind not in "biuf":
            raise GradingError(f"{what}: a JAX array of dtype {arr.dtype} is not numeric")
        return arr.copy()
    raise GradingError(f"{what}: expected numbers or arrays (or a tuple/dict of them), got a {kind.__name__}")


def to_float(value, what: str) -> np.ndarray:
    """A float64 copy of a numeric answer; text, objects and ragged nestings fail with a message."""
    if _isinstance(value, (str, bytes)):
        raise GradingError(f"{what}: expected a number or array, got the text {_repr(value)[:60]}")
    try:
        arr = _asarray(value, dtype=_float64)
    except Exception as exc:  # noqa: BLE001 - any failure to convert is the answer's fault
        raise GradingError(
            f"{what}: the answer is not a number or numeric array (got {_type(value).__name__}: {exc})"
        ) from None
    if arr.dtype != _float64:
        raise GradingError(f"{what}: the answer is not numeric (dtype {arr.dtype})")
    return arr.copy()


def fmt(arr: np.ndarray) -> str:
    """A short, readable rendering of an array for messages."""
    with np.printoptions(precision=6, suppress=True, threshold=12, edgeitems=3):
        return np.array2string(arr) if arr.ndim else f"{_float(arr):.8g}"


# ------------------------------------------------------------------------------------------------
# deciding


def close(actual, expected, what: str, hint: str = "", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Require ``|actual - expected| <= atol + rtol |expected|`` elementwise, same shape, all finite."""
    got = to_float(actual, what)
    want = to_float(expected, what + " (reference)")
    if got.shape != want.shape:
        raise GradingError(f"{what}: expected shape {want.shape}, got shape {got.shape}. {hint}".rstrip())
    if not _bool(_all(_isfinite(got))):
        raise GradingError(f"{what}: the answer contains NaN or inf: {fmt(got)}. {hint}".rstrip())
    diff = _abs(got - want)
    if _bool(_any(diff > atol + rtol * _abs(want))):
        raise GradingError(
            f"{what}: expected {fmt(want)}, got {fmt(got)} (largest difference {_float(diff.max()):.3g}). {hint}"
            .rstrip())


def equal(actual, expected, what: str, hint: str = "") -> None:
    """Require exact equality (same shape, identical float64 entries)."""
    got = to_float(actual, what)
    want = to_float(expected, what + " (reference)")
    if got.shape != want.shape or not _bool(_array_equal(got, want)):
        raise GradingError(f"{what}: expected exactly {fmt(want)}, got {fmt(got)}. {hint}".rstrip())


def matches(actual, expected, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """True when ``actual`` is numerically close to ``expected`` (used to tell *which* mistake was made)."""
    try:
        got = to_float(actual, "answer")
        want = to_float(expected, "reference")
    except GradingError:
        return False
    if got.shape != want.shape or not _bool(_all(_isfinite(got))):
        return False
    return _bool(_all(_abs(got - want) <= atol + rtol * _abs(want)))


def check(condition, message: str) -> None:
    """A trusted ``assert``: ``condition`` must be a real bool (or a NumPy bool) and true."""
    if _isinstance(condition, np.ndarray) and condition.shape == ():
        condition = condition.item()
    if _type(condition) not in (bool, np.bool_):
        raise GradingError(f"{message} (the check received {_type(condition).__name__}, not a boolean)")
    if not _bool(condition):
        raise GradingError(message)


def diagnose(got, want, mistakes: Callable[[], dict], task: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """When ``got`` differs from ``want``, fail with the message of the classic mistake it matches.

    ``mistakes()`` returns ``{message: the value that mistake produces}``; it is only evaluated when
    the answer is wrong. Nothing is raised when no listed mistake matches (the caller's
    :func:`close` then reports the difference).
    """
    if matches(got, want, rtol=rtol, atol=atol):
        return
    for message, wrong in mistakes().items():
        check(not matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")


def field(result, key: str, task: str):
    """``result[key]`` of a dict the student returned, or a message saying what is missing."""
    check(_isinstance(result, dict), f"{task} must return a dict, got {_type(result).__name__}")
    check(key in result, f"{task} must return a dict with the key {key!r} (got keys {sorted(result)})")
    return result[key]


def pair(result, task: str, what: str = "the pair (weights, rewards)"):
    """A 2-tuple/list the student returned, or a message."""
    check(_isinstance(result, (tuple, list)) and len(result) == 2, f"{task} must return {what}")
    return result


def library_reference() -> types.SimpleNamespace:
    """The course library's reference functions, as checks use them outside a kernel.

    (Inside a kernel, :func:`rlhf_lab.grading.judge` passes the same functions, :data:`rlhf_lab.grading.reference`.)
    """
    from .. import ppo, reward

    fns = {n: getattr(ppo, n) for n in dir(ppo) if not n.startswith("_")
           and _isinstance(getattr(ppo, n), types.FunctionType)}
    return types.SimpleNamespace(**fns, preference_loss=reward.preference_loss, fit_reward=reward.fit_reward)

"""Gradients of a student's function, computed by the judge from the program the function traces to.

A gradient check does not ask the student's kernel for a gradient. It asks for the function's
*program*: the kernel runs ``jax.make_jaxpr`` on the function (the check's differentiated arguments
as the inputs, the others held at their values, as ``jax.grad`` holds them) and sends the result as
plain data (:func:`rlhf_lab.judging.wire.describe`), beside the value of the call. This module, in
the grader, then owns every step that decides:

* :func:`parse` validates the data (every field's type, every variable defined before it is used,
  nested programs only by reference to later entries, dtypes and shapes from fixed sets) and
  bounds it (:class:`Limits`: equations, nesting, constants, elements per value, total work, loop
  lengths). Nothing of it is executed as code: no ``eval``, no ``pickle``, no import by name.
* :class:`_Run` rebuilds the program as a Python function over *this process's* JAX: each
  equation's primitive name is looked up in a fixed table (:data:`RULES`) of the grader's own
  ``lax`` functions and primitives. ``jit`` and custom-derivative calls are evaluated through their
  primal program (what ``jax.nn.relu`` or ``logsumexp`` mean), never through a rule the kernel
  supplies; ``cond``, ``scan`` and ``while`` become the grader's ``lax.switch``, ``lax.scan`` and a
  ``lax.while_loop`` with an iteration bound.
* :func:`judge_gradient` checks the rebuilt program's value against the value the kernel returned
  for the same inputs (a program that is not the function that ran fails), then differentiates it
  with this process's ``jax.grad``.

Whatever the kernel sends *is* the answer that is graded: a program that passes every check is a
correct program, however the kernel came by it. A primitive outside the table (a callback, random
bits, a collective) fails the check with its name and what to write instead.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from . import wire
from .errors import GradingError

#: dtypes a program's values may have.
DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64", "bool"})
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,39}")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds of one program (checked by :func:`parse` before anything runs, work while it runs)."""

    jaxprs: int = 64            # programs, nested ones included
    equations: int = 4_000      # equations in all
    depth: int = 8              # nesting of programs inside programs
    rank: int = 8               # dimensions of one value
    elements: int = 1 << 22     # elements of one value
    const_elements: int = 1 << 20  # elements of all constants together
    loop_length: int = 100_000  # length of one scan
    while_iterations: int = 10_000  # iterations of one while loop
    work: float = 2e8           # elements read and written, loops counted as many times as they run


LIMITS = Limits()


class ProgramError(GradingError):
    """The program cannot be graded (malformed, over a limit, a primitive the grader does not run)."""


# ------------------------------------------------------------------------------------------------
# the parsed program


@dataclasses.dataclass(frozen=True)
class Var:
    id: int
    dtype: str
    shape: tuple


@dataclasses.dataclass(frozen=True)
class Literal:
    value: np.ndarray


@dataclasses.dataclass(frozen=True)
class Eqn:
    primitive: str
    inputs: tuple          # of int (a variable's id) or Literal
    outputs: tuple         # of Var
    params: dict


@dataclasses.dataclass(frozen=True)
class Jaxpr:
    inputs: tuple          # of Var
    consts: tuple          # of (Var, index into Program.consts)
    eqns: tuple
    outputs: tuple         # of int or Literal


@dataclasses.dataclass(frozen=True)
class Program:
    jaxprs: tuple
    consts: tuple          # of np.ndarray

    @property
    def root(self) -> Jaxpr:
        return self.jaxprs[0]


@dataclasses.dataclass(frozen=True)
class Ref:
    """A parameter naming a nested program (``jaxprs[index]``)."""

    index: int


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A parameter the judge has no use for (a sharding, a layout, a custom rule): never bound."""

    kind: str


def _fail(message: str):
    raise ProgramError(f"the program your function traces to {message}")


def _expect(condition, message: str) -> None:
    if not condition:
        _fail(message)


def _var(node, limits: Limits) -> Var:
    _expect(type(node) is list and len(node) == 3, "has a malformed variable")
    ident, dtype, shape = node
    _expect(type(ident) is int and ident >= 0, "has a malformed variable id")
    _expect(type(dtype) is str and dtype in DTYPES, f"has a value of an unsupported dtype ({str(dtype)[:20]!r})")
    _expect(type(shape) is list and len(shape) <= limits.rank
            and all(type(d) is int and 0 <= d <= limits.elements for d in shape), "has a malformed shape")
    _expect(math.prod(shape) <= limits.elements,
            f"has a value of shape {tuple(shape)}, over the grader's {limits.elements:,} elements")
    return Var(ident, dtype, tuple(shape))


def _array(node, what: str) -> np.ndarray:
    try:
        value = wire.decode(node)
    except (wire.Refused, KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        _fail(f"has a malformed {what} ({str(exc)[:120]})")
    _expect(type(value) is np.ndarray and value.dtype.name in DTYPES, f"has a {what} that is not a numeric array")
    return value


_ENUMS = {"GatherScatterMode", "Precision", "RoundingMethod"}
_TUPLES = {"GatherDimensionNumbers", "ScatterDimensionNumbers"}


def _param(node, count: int, here: int, depth: int = 0):
    if depth > 8:
        _fail("has a parameter nested too deeply")
    if node is None or type(node) in (bool, int, float):
        return node
    if type(node) is str:
        return node[:200]
    if type(node) is list:
        return tuple(_param(v, count, here, depth + 1) for v in node)
    _expect(type(node) is dict and len(node) in (1, 2), "has a malformed parameter")
    if "jaxpr" in node:
        index = node["jaxpr"]
        _expect(type(index) is int and here < index < count, "refers to a nested program out of order")
        return Ref(index)
    if "dtype" in node:
        _expect(node["dtype"] in DTYPES, "has a parameter of an unsupported dtype")
        return np.dtype(node["dtype"]) if node["dtype"] != "bfloat16" else _bfloat16()
    if "enum" in node:
        _expect(node["enum"] in _ENUMS and type(node.get("name")) is str, "has an unknown parameter type")
        return _enum(node["enum"], node["name"])
    if "nt" in node:
        _expect(node["nt"] in _TUPLES and type(node.get("v")) is dict, "has an unknown parameter type")
        return (node["nt"], {str(k)[:40]: _param(v, count, here, depth + 1) for k, v in node["v"].items()})
    if "opaque" in node:
        return Opaque(str(node["opaque"])[:40])
    _fail("has a malformed parameter")


def _bfloat16():
    import jax.numpy as jnp

    return np.dtype(jnp.bfloat16)


def _enum(kind: str, name: str):
    from jax import lax

    enum = {"GatherScatterMode": lax.GatherScatterMode, "Precision": lax.Precision,
            "RoundingMethod": lax.RoundingMethod}[kind]
    _expect(name in enum.__members__, f"has an unknown {kind}")
    return enum[name]


def parse(body, limits: Limits = LIMITS) -> Program:
    """The :class:`Program` that ``body`` (the kernel's JSON data, :func:`rlhf_lab.judging.wire.describe`)
    describes, validated and bounded; :class:`ProgramError` naming the problem otherwise. A primitive
    outside :data:`RULES` is refused here, before anything runs."""
    _expect(type(body) is dict and type(body.get("jaxprs")) is list and type(body.get("consts")) is list,
            "was not sent (the kernel's answer holds no program)")
    raw, raw_consts = body["jaxprs"], body["consts"]
    _expect(0 < len(raw) <= limits.jaxprs, f"has {len(raw)} nested programs; the grader reads at most {limits.jaxprs}")
    consts, total = [], 0
    for node in raw_consts:
        value = _array(node, "constant")
        total += value.size
        _expect(total <= limits.const_elements,
                f"closes over more than {limits.const_elements:,} numbers in arrays; compute them inside "
                "the function or pass them as arguments")
        consts.append(value)
    jaxprs, equations = [], 0
    for here, node in enumerate(raw):
        _expect(type(node) is dict and all(type(node.get(k)) is list for k in ("in", "const", "eqns", "out")),
                "has a malformed part")
        defined: dict[int, Var] = {}

        def define(var: Var) -> Var:
            _expect(var.id not in defined, "defines a variable twice")
            defined[var.id] = var
            return var

        def atom(a):
            if type(a) is int:
                _expect(a in defined, "uses a variable before it is defined")
                return a
            _expect(type(a) is dict and set(a) == {"lit"}, "has a malformed operand")
            value = _array(a["lit"], "literal")
            _expect(value.size <= 16, "has a literal that is not a number")
            return Literal(value)

        const = []
        for item in node["const"]:
            _expect(type(item) is list and len(item) == 2 and type(item[1]) is int and 0 <= item[1] < len(consts),
                    "refers to a constant it does not have")
            var = define(_var(item[0], limits))
            value = consts[item[1]]
            _expect(value.dtype.name == var.dtype and value.shape == var.shape, "has a constant of the wrong shape")
            const.append((var, item[1]))
        inputs = tuple(define(_var(v, limits)) for v in node["in"])
        eqns = []
        for e in node["eqns"]:
            equations += 1
            _expect(equations <= limits.equations,
                    f"has more than {limits.equations:,} operations; the grader reads at most {limits.equations:,}")
            _expect(type(e) is list and len(e) == 4 and type(e[0]) is str and type(e[1]) is list
                    and type(e[2]) is list and type(e[3]) is dict, "has a malformed operation")
            name = e[0]
            if name not in RULES:
                shown = name if _NAME.fullmatch(name) else "an unnamed primitive"
                raise ProgramError(unknown_primitive_message(shown))
            params = {str(k)[:40]: _param(v, len(raw), here) for k, v in e[3].items()}
            ins = tuple(atom(a) for a in e[1])
            outs = tuple(define(_var(v, limits)) for v in e[2])
            eqns.append(Eqn(name, ins, outs, params))
        outputs = tuple(atom(a) for a in node["out"])
        jaxprs.append(Jaxpr(inputs, tuple(const), tuple(eqns), outputs))
    program = Program(tuple(jaxprs), tuple(consts))
    _bounded(program, limits)
    return program


def unknown_primitive_message(name: str) -> str:
    """The failure of a program that uses a primitive outside :data:`RULES`."""
    advice = ("callbacks run Python the grader cannot differentiate: compute the value with jax.numpy "
              "operations inside the function" if "callback" in name else
              "write the function with jax.numpy / jax.nn / jax.lax operations on its inputs")
    return (f"the program your function traces to uses `{name}`, which the grader does not differentiate; "
            f"{advice}")


def _refs(eqn: Eqn):
    for value in eqn.params.values():
        if isinstance(value, Ref):
            yield value.index
        elif type(value) is tuple:
            for v in value:
                if isinstance(v, Ref):
                    yield v.index


def _bounded(program: Program, limits: Limits) -> None:
    """Nesting depth and a static bound of the work (elements in and out of every equation, times the
    iterations of the loops around it), before anything runs."""
    memo: dict[int, float] = {}

    def cost(index: int, depth: int) -> float:
        _expect(depth <= limits.depth, f"nests programs more than {limits.depth} deep")
        if index in memo:
            return memo[index]
        total = 0.0
        for eqn in program.jaxprs[index].eqns:
            total += sum(math.prod(v.shape) for v in eqn.outputs) + len(eqn.inputs)
            times = 1.0
            if eqn.primitive == "scan":
                length = eqn.params.get("length")
                _expect(type(length) is int and 0 <= length <= limits.loop_length,
                        f"has a scan over more than {limits.loop_length:,} steps")
                times = float(max(length, 1))
            elif eqn.primitive == "while":
                times = float(limits.while_iterations)
            for ref in _refs(eqn):
                total += times * cost(ref, depth + 1)
            _expect(total <= limits.work, "does more work than the grader allows for one test")
        memo[index] = total
        return total

    cost(0, 0)


# ------------------------------------------------------------------------------------------------
# rebuilding it over the grader's JAX


def _prims():
    from jax.extend.core import primitives as P

    return P


#: Primitives bound as they are, with the parameters each may carry (all of them plain values).
_PLAIN_PARAMS = {
    **{n: () for n in ("add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "neg", "sign", "floor",
                       "ceil", "is_finite", "abs", "square", "eq", "ne", "lt", "le", "gt", "ge", "and", "or",
                       "not", "xor", "select_n", "clamp", "erf", "erfc", "erf_inv", "lgamma", "digamma", "real",
                       "nextafter", "copy", "copy_p", "stop_gradient")},
    **{n: ("accuracy",) for n in ("exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt",
                                  "cbrt", "sin", "cos", "tan")},
    "round": ("rounding_method",),
    "integer_pow": ("y",),
    "convert_element_type": ("new_dtype", "weak_type", "sharding"),
    "reduce_sum": ("axes", "out_sharding"),
    "reduce_max": ("axes", "out_sharding"),
    "reduce_min": ("axes", "out_sharding"),
    "reduce_prod": ("axes", "out_sharding"),
    "reduce_and": ("axes",),
    "reduce_or": ("axes",),
    "argmax": ("axes", "index_dtype"),
    "argmin": ("axes", "index_dtype"),
    "broadcast_in_dim": ("shape", "broadcast_dimensions", "sharding"),
    "reshape": ("new_sizes", "dimensions", "sharding"),
    "squeeze": ("dimensions",),
    "transpose": ("permutation",),
    "rev": ("dimensions",),
    "concatenate": ("dimension",),
    "pad": ("padding_config",),
    "slice": ("start_indices", "limit_indices", "strides"),
    "dynamic_slice": ("slice_sizes",),
    "dynamic_update_slice": (),
    "iota": ("dtype", "shape", "dimension", "sharding"),
    "dot_general": ("dimension_numbers", "precision", "preferred_element_type", "out_sharding"),
    "cumsum": ("axis", "reverse"),
    "cumprod": ("axis", "reverse"),
    "cummax": ("axis", "reverse"),
    "cummin": ("axis", "reverse"),
    "cumlogsumexp": ("axis", "reverse"),
    "sort": ("dimension", "is_stable", "num_keys"),
    "split": ("sizes", "axis"),
}
_PRIMITIVE_ATTR = {"stop_gradient": "stop_gradient_p", "copy_p": "copy_p"}


class _Run:
    """One evaluation of a program (its work counted against the limits)."""

    def __init__(self, program: Program, limits: Limits):
        self.program, self.limits = program, limits
        #: one boolean per while loop evaluated: true when it stopped at the iteration bound
        self.overflows: list = []

    def jaxpr(self, index: int, args) -> list:
        jp = self.program.jaxprs[index]
        env: dict[int, Any] = {}
        for var, ci in jp.consts:
            env[var.id] = self.program.consts[ci]
        _expect(len(args) == len(jp.inputs), "is called with the wrong number of inputs")
        for var, value in zip(jp.inputs, args):
            env[var.id] = value
        read = (lambda a: a.value if isinstance(a, Literal) else env[a])
        for eqn in jp.eqns:
            ins = [read(a) for a in eqn.inputs]
            outs = RULES[eqn.primitive](self, eqn, ins)
            _expect(len(outs) == len(eqn.outputs), f"has a `{eqn.primitive}` with the wrong number of results")
            for var, value in zip(eqn.outputs, outs):
                shape, dtype = tuple(np.shape(value)), np.dtype(getattr(value, "dtype", None) or np.float64).name
                _expect(shape == var.shape and dtype == var.dtype,
                        f"has a `{eqn.primitive}` whose result is {dtype}{list(shape)}, not the "
                        f"{var.dtype}{list(var.shape)} it declares")
                env[var.id] = value
        return [read(a) for a in jp.outputs]

    def closed(self, ref):
        _expect(isinstance(ref, Ref), "has a control-flow operation without its program")
        return lambda *args: self.jaxpr(ref.index, list(args))


def _bind_plain(run: _Run, eqn: Eqn, ins):
    allowed = _PLAIN_PARAMS[eqn.primitive]
    params = {}
    for key, value in eqn.params.items():
        _expect(key in allowed and _plain(value), f"has a `{eqn.primitive}` with an unexpected parameter `{key}`")
        params[key] = _typed(key, value)
    prim = getattr(_prims(), _PRIMITIVE_ATTR.get(eqn.primitive, eqn.primitive + "_p"))
    out = prim.bind(*ins, **params)
    return list(out) if prim.multiple_results else [out]


def _plain(value) -> bool:
    """True for a parameter made of numbers, texts, dtypes, enums and tuples of them (no nested
    program, nothing opaque)."""
    if isinstance(value, (Ref, Opaque)):
        return False
    if type(value) is tuple:
        return all(_plain(v) for v in value) and not (len(value) == 2 and type(value[1]) is dict
                                                      and not all(_plain(v) for v in value[1].values()))
    return value is None or type(value) in (bool, int, float, str, dict) or isinstance(value, np.dtype) \
        or type(value).__module__.startswith("jax")


def _typed(key: str, value):
    """A decoded parameter in the type the grader's primitive expects (named tuples rebuilt)."""
    if type(value) is tuple and len(value) == 2 and value[0] in _TUPLES and type(value[1]) is dict:
        return _named(*value)
    return value


def _named(kind: str, fields: dict):
    from jax import lax

    cls = {"GatherDimensionNumbers": lax.GatherDimensionNumbers,
           "ScatterDimensionNumbers": lax.ScatterDimensionNumbers}[kind]
    _expect(set(fields) <= set(cls._fields), f"has a malformed {kind}")
    return cls(**{k: v for k, v in fields.items()})


def _gather(run: _Run, eqn: Eqn, ins):
    from jax import lax

    p = eqn.params
    _expect(len(ins) == 2, "has a malformed gather")
    return [lax.gather(ins[0], ins[1], _named(*p["dimension_numbers"]), tuple(p["slice_sizes"]),
                       unique_indices=bool(p.get("unique_indices")),
                       indices_are_sorted=bool(p.get("indices_are_sorted")), mode=p.get("mode"),
                       fill_value=p.get("fill_value"))]


def _scatter(function_name: str):
    def rule(run: _Run, eqn: Eqn, ins):
        from jax import lax

        p = eqn.params
        _expect(len(ins) == 3, f"has a malformed {eqn.primitive}")
        fn = getattr(lax, function_name)
        return [fn(ins[0], ins[1], ins[2], _named(*p["dimension_numbers"]),
                   indices_are_sorted=bool(p.get("indices_are_sorted")),
                   unique_indices=bool(p.get("unique_indices")), mode=p.get("mode"))]

    return rule


def _inline(key: str):
    """``jit``, ``closed_call``, ``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``: the nested
    program evaluated in place (custom derivative rules are the kernel's, and never used)."""
    def rule(run: _Run, eqn: Eqn, ins):
        return run.closed(eqn.params.get(key))(*ins)

    return rule


def _tile(run: _Run, eqn: Eqn, ins):
    import jax.numpy as jnp

    reps = eqn.params.get("reps")
    _expect(len(ins) == 1 and type(reps) is tuple and all(type(r) is int and r >= 0 for r in reps),
            "has a malformed tile")
    return [jnp.tile(ins[0], reps)]


def _cond(run: _Run, eqn: Eqn, ins):
    from jax import lax

    branches = eqn.params.get("branches")
    _expect(type(branches) is tuple and branches and all(isinstance(b, Ref) for b in branches),
            "has a malformed cond")
    _expect(len(ins) >= 1, "has a malformed cond")
    fns = [(lambda *ops, _b=b: tuple(run.closed(_b)(*ops))) for b in branches]
    index = ins[0]
    if np.dtype(getattr(index, "dtype", np.int32)) == np.bool_:
        index = lax.convert_element_type(index, np.int32)
    return list(lax.switch(index, fns, *ins[1:]))


def _scan(run: _Run, eqn: Eqn, ins):
    from jax import lax

    p = eqn.params
    n_consts, n_carry, length = p.get("num_consts"), p.get("num_carry"), p.get("length")
    _expect(all(type(v) is int and v >= 0 for v in (n_consts, n_carry, length))
            and n_consts + n_carry <= len(ins), "has a malformed scan")
    body = run.closed(p.get("jaxpr"))
    consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]

    def step(c, x):
        out = body(*consts, *c, *x)
        return tuple(out[:n_carry]), tuple(out[n_carry:])

    final, ys = lax.scan(step, tuple(carry), tuple(xs), length=length, reverse=bool(p.get("reverse")))
    return [*final, *ys]


def _while(run: _Run, eqn: Eqn, ins):
    """``lax.while_loop`` with a counter: a loop still running after :attr:`Limits.while_iterations`
    stops, and :attr:`_Run.overflows` says so (:func:`judge_gradient` then fails the check)."""
    import jax.numpy as jnp
    from jax import lax

    p = eqn.params
    nc, nb = p.get("cond_nconsts"), p.get("body_nconsts")
    _expect(type(nc) is int and type(nb) is int and 0 <= nc and 0 <= nb and nc + nb <= len(ins),
            "has a malformed while loop")
    cond, body = run.closed(p.get("cond_jaxpr")), run.closed(p.get("body_jaxpr"))
    cconsts, bconsts, init = ins[:nc], ins[nc:nc + nb], ins[nc + nb:]
    bound = run.limits.while_iterations

    def keep_going(state):
        i, vals = state
        return jnp.logical_and(cond(*cconsts, *vals)[0], i < bound)

    def step(state):
        i, vals = state
        return i + 1, tuple(body(*bconsts, *vals))

    count, final = lax.while_loop(keep_going, step, (jnp.int32(0), tuple(init)))
    run.overflows.append(jnp.logical_and(count >= bound, cond(*cconsts, *final)[0]))
    return list(final)


def _build_rules() -> dict:
    rules = {name: _bind_plain for name in _PLAIN_PARAMS}
    rules.update({
        "gather": _gather,
        "scatter-add": _scatter("scatter_add"), "scatter_add": _scatter("scatter_add"),
        "scatter": _scatter("scatter"), "scatter-mul": _scatter("scatter_mul"),
        "scatter_mul": _scatter("scatter_mul"), "scatter-min": _scatter("scatter_min"),
        "scatter_min": _scatter("scatter_min"), "scatter-max": _scatter("scatter_max"),
        "scatter_max": _scatter("scatter_max"),
        "jit": _inline("jaxpr"), "pjit": _inline("jaxpr"), "closed_call": _inline("call_jaxpr"),
        "core_call": _inline("call_jaxpr"), "custom_jvp_call": _inline("call_jaxpr"),
        "custom_vjp_call": _inline("call_jaxpr"), "custom_vjp_call_jaxpr": _inline("fun_jaxpr"),
        "checkpoint": _inline("jaxpr"), "remat2": _inline("jaxpr"), "tile": _tile,
        "cond": _cond, "scan": _scan, "while": _while,
    })
    return rules


#: Primitive name -> how the grader evaluates it with its own JAX. Anything else is refused.
RULES = _build_rules()


# ------------------------------------------------------------------------------------------------
# judging a gradient


def _input(value, var: Var):
    import jax.numpy as jnp

    arr = np.asarray(value)
    _expect(arr.shape == var.shape, f"takes an input of shape {list(var.shape)} where the test passed {list(arr.shape)}")
    return jnp.asarray(arr, dtype=var.dtype)


def value_mismatch_message(task: str) -> str:
    return (f"{task}: the program your function traced to does not compute the value your function returned "
            "(the grader differentiates that program); your function must compute its result with JAX "
            "operations on its inputs")


def judge_gradient(task: str, value, body, args: tuple, argnums, limits: Limits = LIMITS):
    """``jax.grad`` (of this process) of the program ``body`` with respect to the arguments ``argnums``
    of ``args`` (the check's own inputs, arrays), after checking that the program's value on them is
    ``value`` (what the kernel's function returned, plain data). A tuple of float64 NumPy gradients
    when ``argnums`` is a tuple or list, one array otherwise; :class:`ProgramError` /
    :class:`GradingError` with the reason."""
    import jax

    program = parse(body, limits)
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    _expect(all(type(i) is int and 0 <= i < len(args) for i in nums), "was asked for arguments it does not have")
    _expect(len(program.root.inputs) == len(nums),
            f"takes {len(program.root.inputs)} inputs where {len(nums)} were differentiated")
    _expect(len(program.root.outputs) == 1, "returns more than one value")
    nargs = len(nums)

    def value_and_overflow(*x):
        run = _Run(program, limits)
        out = run.jaxpr(0, list(x))[0]
        return out, (jnp.any(jnp.stack(run.overflows)) if run.overflows else jnp.bool_(False))

    with jax.enable_x64(True):
        import jax.numpy as jnp

        inputs = [_input(args[i], var) for i, var in zip(nums, program.root.inputs)]
        try:  # every shape and parameter checked abstractly before any array is made
            shape = jax.eval_shape(value_and_overflow, *inputs)[0]
        except GradingError:
            raise
        except Exception as exc:  # noqa: BLE001 - a program the grader's JAX refuses is the answer's problem
            _fail(f"could not be rebuilt by the grader ({type(exc).__name__}: {str(exc)[:300]})")
        if shape.shape != ():
            raise GradingError(f"{task}: jax.grad needs a function that returns one number; yours returns shape "
                               f"{shape.shape}")
        if np.dtype(shape.dtype).kind != "f":
            raise GradingError(f"{task}: jax.grad needs a function that returns a float; yours returns {shape.dtype}")
        # one compiled program for the value and the gradient (a few tens of ms), not an XLA
        # compilation per primitive as an op-by-op evaluation would cost in a fresh grader process
        both = jax.jit(jax.value_and_grad(value_and_overflow, argnums=tuple(range(nargs)), has_aux=True))
        try:
            (rebuilt, overflow), grads = both(*inputs)
        except GradingError:
            raise
        except Exception as exc:  # noqa: BLE001
            _fail(f"could not be differentiated by the grader ({type(exc).__name__}: {str(exc)[:300]})")
        if bool(overflow):
            _fail(f"has a while loop that ran more than {limits.while_iterations:,} iterations")
        if not _same_value(np.asarray(rebuilt), value):
            raise GradingError(value_mismatch_message(task))
        grads = [np.array(g) for g in grads]
    return tuple(grads) if isinstance(argnums, (tuple, list)) else grads[0]


def _same_value(rebuilt: np.ndarray, value) -> bool:
    """The rebuilt program's value agrees with the kernel's (float32 rounding apart: the two may run
    the operations in another order, compiled or not)."""
    try:
        got = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    want = rebuilt.astype(np.float64)
    if got.shape != want.shape:
        return False
    both_nan = np.isnan(got) & np.isnan(want)
    return bool(np.all(both_nan | (np.abs(got - want) <= 1e-5 + 1e-4 * np.abs(want))))
